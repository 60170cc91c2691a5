"""Slurm as a deploy target (issue 27): the same knobs, changelog and evidence drive a stack that runs as
ONE Slurm job. The pyinfra host is the login node (SSH or @local); its data says
`service_manager = "slurm"`, the partition, account and time limit, and what each role's components
get (`<role>_slurm`). A job's environment cannot change, so a change is a new job: the deploy submits
it, gates its prefill, decode and router components where Slurm placed them, and only then cancels
the job it replaces; a failed gate cancels the new job and leaves the old one serving.

    job         settings from host data, the job script (templates/slurm-job.sh.j2, rendered through
                deploy/render.py: review shows it, check lints it), placements, the script's meta line
    client      sbatch / squeue / scontrol / scancel / sinfo on the login host, each with a timeout,
                parsed into typed rows; Slurm's refusals as one line naming the data key
    decide      keep the running job or submit a new one, and why in words (deploy and `plan`)
    ops         the pyinfra side: preflight (sinfo, sbatch --test-only), upload, submit, gate, retire
    status      the serving job seen from the controller: `status`, `plan`, ab run's probes, snapshots
    srtctl      `knobkeeper import srtctl RECIPE`: an srt-slurm recipe as an inventory + knobs.toml
    localcluster  a real cluster on this machine (munged, slurmctld, N slurmd): tests, demo, bench

May import what knobkeeper.deploy may import, and knobkeeper.deploy itself; nothing above it.
"""
