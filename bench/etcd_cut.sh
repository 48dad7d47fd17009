#!/bin/bash
# A node of an elastic job cut off from the rendezvous: how each side behaves, over etcd v3 (the
# default here) or the c10d TCP store (BACKEND=c10d), on two named hosts (network namespaces epA
# and epB, a veth pair, 198.18.77.1/.2; etcd 3.4 in epA). Root; Debian's etcd-server.
#
#   sudo bench/etcd_cut.sh RUN_NAME CUT_SECONDS [--rdzv-conf string]
#   env: BIN=build/bin, BACKEND=etcd|c10d, MODE=link|drop (drop: both sides' ARP entries point at a
#   MAC nobody has: packets dropped, link up), RESTART_B=1 (a fresh agent on B after the restore
#   if its first exited), AFTER=150 (x0.2 s to wait for the rejoin)
#
# One worker per node (a shell loop: one line per round into ROUNDS, then it waits for DONE). Once
# both are in a world of 2, B's link goes down for CUT s and comes back; DONE is touched once both
# are in a world of 2 again (or AFTER runs out). Every line is stamped with seconds since the cut.
# Results: docs/BENCHMARKS.md, "A node cut off from etcd" (written by a helper, thirty-third
# session). Runs are bounded (timeout 400 on every daemon and agent) and clean up after themselves.
set -u
RUN=$1; CUT=$2; CONF=${3:-}
BIN=${BIN:-$(cd "$(dirname "$0")/.." && pwd)/build/bin}
D=${OUT_DIR:-/tmp/etcd-cut}/run-$RUN
NA=epA NB=epB VA=epva VB=epvb IPA=198.18.77.1 IPB=198.18.77.2
rm -rf "$D"; mkdir -p "$D"
WORKER=$D/worker.sh
cat > "$WORKER" <<'WORKER_EOF'
#!/bin/sh
# one line per round: rank world group_rank group_world restarts wall-ns; then wait for DONE (300 s)
echo "$RANK $WORLD_SIZE $GROUP_RANK $GROUP_WORLD_SIZE $TORCHELASTIC_RESTART_COUNT $(date +%s%N)" >> "$1"
i=0; while [ ! -f "$2" ] && [ $i -lt 1500 ]; do sleep 0.2; i=$((i+1)); done
WORKER_EOF
chmod +x "$WORKER"
now() { date +%s.%N; }
T0FILE=$D/t0
echo 0 > "$T0FILE"   # replaced by the cut time; stamps before it are absolute-relative to start
START=$(now)
# stamp: prefix each line with seconds since the cut (or since start, as "pre+X", before the cut)
stamp() {
  perl -MTime::HiRes=time -ne 'BEGIN{$|=1; $s=$ARGV[0]; shift @ARGV} open(F,"<","'"$T0FILE"'"); $t0=<F>; close F; chomp $t0;
     if ($t0 > 0) { printf("[cut%+8.2f] %s", time()-$t0, $_) } else { printf("[pre %7.2f] %s", time()-$s, $_) }' "$START"
}
log() { echo "$*" | stamp | tee -a "$D/driver.log"; }

cleanup() {
  for p in $(ip netns pids $NA 2>/dev/null) $(ip netns pids $NB 2>/dev/null) ${PIDS:-}; do kill -KILL "$p" 2>/dev/null; done
  sleep 0.5
  ip netns del $NA 2>/dev/null; ip netns del $NB 2>/dev/null
  rm -rf /etc/netns/$NA /etc/netns/$NB
  rm -rf "$D/etcd-data"
}
trap cleanup EXIT

ip netns add $NA; ip netns add $NB
ip link add $VA type veth peer name $VB
ip link set $VA netns $NA; ip link set $VB netns $NB
ip -n $NA addr add $IPA/24 dev $VA; ip -n $NB addr add $IPB/24 dev $VB
for n in $NA:$VA $NB:$VB; do ip -n ${n%:*} link set ${n#*:} up; ip -n ${n%:*} link set lo up; done
for n in $NA $NB; do
  mkdir -p /etc/netns/$n
  printf '127.0.0.1 localhost\n%s node-a\n%s node-b\n' $IPA $IPB > /etc/netns/$n/hosts
done

# etcd on host A
ip netns exec $NA timeout 400 etcd --name s1 --data-dir "$D/etcd-data" \
  --listen-client-urls http://$IPA:2379 --advertise-client-urls http://$IPA:2379 \
  --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
  --initial-cluster s1=http://127.0.0.1:2380 > "$D/etcd.log" 2>&1 &
PIDS="$!"
for i in $(seq 50); do ip netns exec $NA curl -s http://$IPA:2379/health | grep -q true && break; sleep 0.2; done
log "etcd healthy: $(ip netns exec $NA curl -s http://$IPA:2379/health)"

if [ "${BACKEND:-etcd}" = c10d ]; then RDZV="--rdzv-backend c10d --rdzv-endpoint $IPA:29400"
else RDZV="--rdzv-backend etcd-v3 --rdzv-endpoint $IPA:2379"; fi
agent() { # NS HOSTNAME NAME IP [LOGNAME]
  local conf=(); [ -n "$CONF" ] && conf=(--rdzv-conf "$CONF")
  ( ip netns exec $1 unshare --uts sh -c "hostname $2; exec timeout 400 $BIN/dist-launch \
      --nnodes 1:2 $RDZV --rdzv-id job-$RUN \
      --nproc-per-node 1 --local-addr $4 ${conf[*]} --event-log $D/$3.events \
      --no-python $WORKER $D/$3.rounds $D/DONE" 2>&1
    echo "EXIT CODE $?" ) | stamp > "$D/${5:-$3}.log" &
  PIDS="$PIDS $!"
}
world_of() { [ -f "$D/$1.rounds" ] && tail -n +$(( ${3:-0} + 1 )) "$D/$1.rounds" | awk -v w=$2 '$2==w{f=1} END{exit !f}'; }
nlines() { [ -f "$D/$1.rounds" ] && wc -l < "$D/$1.rounds" || echo 0; }

agent $NA node-a a $IPA
sleep 2
agent $NB node-b b $IPB
for i in $(seq 300); do world_of a 2 && world_of b 2 && break; sleep 0.2; done
world_of a 2 && world_of b 2 || { log "never reached a world of 2"; tail -50 "$D/a.log" "$D/b.log"; exit 1; }
log "both in a world of 2"
sleep 3
A0=$(nlines a); B0=$(nlines b)
now > "$T0FILE"
if [ "${MODE:-link}" = drop ]; then
  # silent drop: each side's neighbour entry for the other points at a MAC nobody has, so frames
  # are dropped by the receiving veth (no ICMP, link up, no error to the sender)
  ip -n $NB neigh replace $IPA lladdr 02:00:00:00:de:ad dev $VB nud permanent
  ip -n $NA neigh replace $IPB lladdr 02:00:00:00:de:ae dev $VA nud permanent
else ip -n $NB link set $VB down; fi
log "CUT (${MODE:-link}): $VB"
end=$(( $(date +%s) + CUT ))
while [ $(date +%s) -lt $end ]; do
  world_of a 1 $A0 && [ -z "${ANOTE:-}" ] && { log "A's rounds file shows a world of 1"; ANOTE=1; }
  sleep 0.2
done
if [ "${MODE:-link}" = drop ]; then
  ip -n $NB neigh del $IPA dev $VB; ip -n $NA neigh del $IPB dev $VA
else ip -n $NB link set $VB up; fi
log "RESTORE (${MODE:-link}): $VB"
A1=$(nlines a)
if [ -n "${RESTART_B:-}" ] && grep -q "EXIT CODE" "$D/b.log"; then
  log "B's agent had exited: starting a fresh agent on B (log b2.log, rounds into b.rounds)"
  agent $NB node-b b $IPB b2
fi
for i in $(seq ${AFTER:-150}); do
  world_of a 2 $A1 && world_of b 2 $B0 && { log "both in a world of 2 again"; break; }
  sleep 0.2
done
log "touching DONE"
touch "$D/DONE"
for i in $(seq 600); do
  grep -q "EXIT CODE" "$D/a.log" && grep -q "EXIT CODE" "$D/b.log" && { [ ! -f "$D/b2.log" ] || grep -q "EXIT CODE" "$D/b2.log"; } && break; sleep 0.2
done
log "finished waiting"
echo "== a.rounds (rank world group_rank group_world restarts ns)"; cat "$D/a.rounds"
echo "== b.rounds"; cat "$D/b.rounds" 2>/dev/null
echo "== a.log"; cat "$D/a.log"
echo "== b.log"; cat "$D/b.log"
[ -f "$D/b2.log" ] && { echo "== b2.log"; cat "$D/b2.log"; }
echo "== driver"; cat "$D/driver.log"
echo "== events"; for f in a b; do echo "-- $f"; cat "$D/$f.events" 2>/dev/null | cut -c1-300; done
