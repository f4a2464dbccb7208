#!/bin/sh
# Slurm Prolog: rnic-exporter check before a job starts on this node.
#
# Install as /etc/slurm/prolog.d/50-rnic-check.sh (mode 0755), with Prolog=/etc/slurm/prolog.d/*
# in slurm.conf. A Prolog that exits non-zero drains the node and requeues the job, so this exits
# non-zero only when check found a problem that breaks jobs on this node (exit 1 at --fail-on
# critical). Anything that says "check could not judge the node" -- a config error pushed to every
# node (exit 2), the binary missing, a crash, a hang -- is logged loudly and lets the job run:
# one bad config must not drain the fleet. Alert on those log lines (or on the exporter's metrics).
#
# Every log line: time (UTC, RFC 3339), host, job, and what happened.

BIN=${RNIC_EXPORTER_BIN:-/opt/rnic-exporter/bin/rnic-exporter}
CONFIG=${RNIC_CHECK_CONFIG:-/etc/rnic-exporter/config.toml}
LOG=${RNIC_CHECK_LOG:-/var/log/rnic-check.log}
TIMEOUT=${RNIC_CHECK_TIMEOUT:-60}  # seconds; keep it well under slurm.conf's PrologEpilogTimeout

HOST=$(hostname 2>/dev/null || uname -n)
JOB=${SLURM_JOB_ID:-none}

log() {
    printf '%s host=%s job=%s %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$HOST" "$JOB" "$*" >>"$LOG" 2>/dev/null
}

if [ ! -x "$BIN" ]; then
    log "level=error msg=\"rnic-exporter not found at $BIN: node not checked, job allowed\""
    exit 0
fi
set -- check --fail-on critical
if [ -e "$CONFIG" ]; then
    set -- "$@" --config "$CONFIG"
fi

OUT=$(timeout -k 5 "$TIMEOUT" "$BIN" "$@" 2>&1)
RC=$?
printf '%s\n' "$OUT" | while IFS= read -r line; do
    [ -n "$line" ] && log "check: $line"
done

case $RC in
    0)
        log "level=info rc=0 msg=\"node healthy\""
        exit 0
        ;;
    1)
        log "level=error rc=1 msg=\"critical RNIC problem: failing the prologue (Slurm drains the node)\""
        exit 1
        ;;
    2)
        log "level=error rc=2 msg=\"check refused its configuration or flags: node not checked, job allowed\""
        exit 0
        ;;
    124|137)
        log "level=error rc=$RC msg=\"check did not finish in ${TIMEOUT}s: node not checked, job allowed\""
        exit 0
        ;;
    *)
        log "level=error rc=$RC msg=\"check failed to run: node not checked, job allowed\""
        exit 0
        ;;
esac
