"""The defaults of the commands that measure (the judgement, the canary), in one place: the library
uses them and the CLI shows them in --help. Imports nothing: every command's start-up reads this.
"""

ALPHA = 0.05                 # family-wise error rate of a judgement (knobkeeper.evidence.judge)
RESTART_NOISE = 0.02         # log-sd of a restart's own speed (the sim draws it; knobkeeper.evidence.canary)
CANARY_DURATION_S = 600.0    # canary --duration: ten minutes of canary windows
CANARY_INTERVAL_S = 30.0     # canary --interval: one sample per host per window
SCRAPE_INTERVAL_S = 1.0      # canary --scrape-interval: how often knobkeeper's own scrape samples
IMBALANCE = 2.0              # canary: a window whose hosts' requests in flight differ more than 2x is not judged

# `ab run` on a real engine (a family that is not simulated), when neither --requests nor --duration
# is given. Measured on real vLLM (bench/real_noise/README.md, knobkeeper.evidence.judge "Real
# noise"): the first window after a restart is the noisiest piece (log-sd 0.42), so each block
# starts with a warm-up load that is measured and recorded (schedule.extra.warmups) but never
# judged; a judged run of 25 s instead of 5 s cuts the window noise from 0.26 to ~0.12.
REAL_RUN_S = 25.0            # ab run --duration on a real engine: seconds per judged run
REAL_WARMUP_S = 5.0          # ab run on a real engine: the block's warm-up load, in seconds
REAL_MAX_REPEATS = 10        # ab run on a real engine: the sequential cap (looks after 3, 5, 7, 10); a
                             # real 2x decides in a median of 5 (the cap at 3% noise, 14, would spend
                             # less alpha at the early looks for nothing: real effects worth a restart
                             # each are large, and the real noise is ~0.2, not 0.03)
