#!/bin/bash
# Grade a class in 8 shards as a Slurm job array, then merge them into one gradebook:
#   sbatch scripts/grade-slurm.sh
#   sbatch --dependency=afterany:<the array's job id> --wrap ".venv/bin/python -m course gradebook \
#     --out grades.csv --roster roster.csv --points points.csv --deadline 2026-12-01T17:00 \
#     --late-penalty 10 shard-*-results.jsonl"
# (the merge takes the class's options: a shard only grades)
# Run from the course's folder (with `make setup` done) on a file system every node sees, with the
# submissions in submissions/<student>/<lesson>.ipynb. Each task grades the slice of the class that
# its number picks; no task needs to know the others.
#SBATCH --job-name=grade
#SBATCH --array=1-8
#SBATCH --cpus-per-task=2
#SBATCH --mem=16G
#SBATCH --time=04:00:00
set -euo pipefail
.venv/bin/python -m course grade --jobs 2 --shard "${SLURM_ARRAY_TASK_ID}/8" \
    --out "shard-${SLURM_ARRAY_TASK_ID}.csv" -- submissions/*/*.ipynb || true  # status 1: an input not graded
