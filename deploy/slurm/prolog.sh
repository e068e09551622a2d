#!/bin/sh
# Slurm Prolog (PrologFlags=Alloc) of the fleetsight-node package: slurmd runs it with a bare
# environment, so the health service's address comes from the HealthCheckProgram's settings file.
# The check itself is health/prolog.py (installed beside this file as preflight): exit 0 fit (or the
# service unreachable: fail open), 1 unfit, which makes Slurm requeue the job elsewhere.
set -a
[ -r /etc/fleetsight/healthcheck.env ] && . /etc/fleetsight/healthcheck.env
set +a
exec /usr/bin/python3 /usr/lib/fleetsight/slurm/preflight "$@"
