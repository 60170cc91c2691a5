"""The defaults of the commands that measure (the judgement, the canary), in one place: the library
uses them and the CLI shows them in --help. Imports nothing: every command's start-up reads this.
"""

ALPHA = 0.05                 # family-wise error rate of a judgement (knobkeeper.evidence.judge)
RESTART_NOISE = 0.02         # log-sd of a restart's own speed (the sim draws it; knobkeeper.evidence.canary)
CANARY_DURATION_S = 600.0    # canary --duration: ten minutes of canary windows
CANARY_INTERVAL_S = 30.0     # canary --interval: one sample per host per window
SCRAPE_INTERVAL_S = 1.0      # canary --scrape-interval: how often knobkeeper's own scrape samples
IMBALANCE = 2.0              # canary: a window whose hosts' requests in flight differ more than 2x is not judged
