#!/usr/bin/env bash
# hangwatch across the nodes of a running Slurm job, by hand, on a real cluster (CI runs a Slurm 22.05 of its
# own on emulated nodes, tests/integration/test_nodes_slurm_real.py, and stand-ins, test_nodes_slurm.py).
#
#   scripts/slurm-stacks.sh JOBID [-- extra hangwatch stacks options]
#   scripts/slurm-stacks.sh 123456 -- --match 'train.py|sglang::' --remote-hangwatch '/shared/venv/bin/hangwatch'
#
# Run it as the job's owner on a login node. It checks what the transport relies on, then runs it:
# the job's nodes (squeue -j J -h -o %N, scontrol show hostnames), that a step may overlap the job's
# own (srun --overlap, Slurm >= 20.11: without it the step waits for CPUs the job holds), and that
# hangwatch runs on a node; then `hangwatch stacks --slurm-job J`. Read-only: each step only reads.
set -euo pipefail
job=${1:?usage: $0 JOBID [-- hangwatch options]}
shift
[ "${1:-}" = "--" ] && shift

echo "== Slurm $(srun --version 2>/dev/null || echo '(srun not found)')"
nodes=$(squeue -j "$job" -h -o %N)
echo "== job $job runs on: $nodes"
scontrol show hostnames "$nodes" | sed 's/^/  /'
first=$(scontrol show hostnames "$nodes" | head -n 1)

echo "== one overlapping step on $first (should print the node's name within a second or two)"
timeout 30 srun --jobid "$job" --overlap -N1 -n1 -w "$first" --quiet hostname \
  || echo "  the step did not start: --overlap unsupported, or not the job's owner"

echo "== hangwatch on $first"
timeout 60 srun --jobid "$job" --overlap -N1 -n1 -w "$first" --quiet hangwatch --version \
  || echo "  hangwatch not on the node's PATH: pass --remote-hangwatch"

echo "== hangwatch stacks --slurm-job $job"
exec hangwatch stacks --slurm-job "$job" "$@"
