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
# Every log line: time (UTC, RFC 3339), host, job, and what happened. The log keeps at most
# RNIC_CHECK_LOG_MAX_BYTES (10 MiB) plus one older generation (<log>.1): no logrotate needed.
#
# On a critical problem the node is drained with the reason check gave ("rnic-check: [CRITICAL]
# mlx5_0 port 1 ..." in `sinfo -R`), before the Prolog fails: slurmctld drains a failed Prolog's
# node as "Prolog error" only when it is not drained already, so the reason says what to fix.

BIN=${RNIC_EXPORTER_BIN:-/opt/rnic-exporter/bin/rnic-exporter}
CONFIG=${RNIC_CHECK_CONFIG:-/etc/rnic-exporter/config.toml}
LOG=${RNIC_CHECK_LOG:-/var/log/rnic-check.log}
TIMEOUT=${RNIC_CHECK_TIMEOUT:-60}  # seconds; keep it well under slurm.conf's PrologEpilogTimeout
LOG_MAX=${RNIC_CHECK_LOG_MAX_BYTES:-10485760}
SCONTROL=${RNIC_CHECK_SCONTROL:-scontrol}

HOST=$(hostname 2>/dev/null || uname -n)
NODE=${SLURMD_NODENAME:-$HOST}  # Slurm's name for this node, which scontrol needs
JOB=${SLURM_JOB_ID:-none}

# One older generation: a busy node runs a prologue per job, for years.
SIZE=$(wc -c <"$LOG" 2>/dev/null || echo 0)
if [ "$SIZE" -ge "$LOG_MAX" ] 2>/dev/null; then
    mv -f "$LOG" "$LOG.1" 2>/dev/null
fi

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
        # The first critical problem, as check printed it; scontrol takes the reason as one argument.
        FIRST=$(printf '%s\n' "$OUT" | grep -m 1 '^\[CRITICAL\]' | cut -c 1-200)
        REASON="rnic-check: ${FIRST:-critical RNIC problem, see $LOG}"
        if timeout -k 5 20 "$SCONTROL" update nodename="$NODE" state=drain reason="$REASON" >/dev/null 2>&1; then
            log "level=error rc=1 msg=\"critical RNIC problem: node drained, failing the prologue\" reason=\"$REASON\""
        else
            log "level=error rc=1 msg=\"critical RNIC problem: failing the prologue (scontrol could not set the drain reason; Slurm drains the node as Prolog error)\""
        fi
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
