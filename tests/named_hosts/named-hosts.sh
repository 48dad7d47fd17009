#!/usr/bin/env bash
# named-hosts.sh: hosts with names for tests, on this one machine. Each host is a network namespace
# with its own host name (a UTS namespace per command), its own /etc/hosts (`ip netns exec`
# bind-mounts /etc/netns/<namespace>/hosts over it) and an IPv4 and an IPv6 address on one private
# bridge (in a namespace of its own, so nothing is added to the machine's network).
#
#   named-hosts.sh check                  exit 0 when usable; else 77 and the reason on stderr
#   named-hosts.sh up RUN [--loopback-self NAME] [--domain D] NAME...
#                                         make the hosts; RUN is dlh<owner pid>-<tag>
#   named-hosts.sh exec RUN NAME CMD...   run CMD as host NAME (this process becomes CMD: same PID)
#   named-hosts.sh down RUN               kill what still runs on RUN's hosts (by PID), remove them
#   named-hosts.sh sweep                  take down the runs whose owner process is gone
#
# In every host's /etc/hosts, NAME resolves to its IPv4 address and NAME-v6 to its IPv6 one (and
# NAME.D to the same with --domain D, as Kubernetes' subdomains do). --loopback-self NAME maps
# NAME to 127.0.1.1 in its own /etc/hosts, as Debian and Ubuntu do for the machine's own name;
# the other hosts still see its real address. Addresses come from 198.18.0.0/15 and fd00:d157::/64
# and exist only inside these namespaces, so runs never collide; namespace names carry RUN.
set -euo pipefail

readonly kIpv4Prefix=198.18.0
readonly kIpv6Prefix=fd00:d157:
readonly kRunPattern='^dlh[0-9]+-[a-z0-9]+$'

die() {
  echo "named-hosts: $*" >&2
  exit 2
}

check() {
  if [ "$(id -u)" -ne 0 ]; then
    echo "named-hosts: needs root (network namespaces, /etc/netns)" >&2
    exit 77
  fi
  for tool in ip unshare hostname; do
    command -v "$tool" >/dev/null || { echo "named-hosts: $tool is missing" >&2; exit 77; }
  done
  local probe="dlh$$-probe"
  if ! ip netns add "$probe" 2>/dev/null; then
    echo "named-hosts: cannot create a network namespace here" >&2
    exit 77
  fi
  local ok=1
  ip -n "$probe" link add br0 type bridge 2>/dev/null || ok=0
  ip netns exec "$probe" unshare --uts true 2>/dev/null || ok=0
  ip netns del "$probe"
  if [ "$ok" -ne 1 ]; then
    echo "named-hosts: bridges or UTS namespaces are not available here" >&2
    exit 77
  fi
}

valid_run() {
  [[ "$1" =~ $kRunPattern ]] || die "RUN '$1' is not dlh<owner pid>-<tag>"
}

namespaces_of() {
  ip netns list | awk '{print $1}' | grep -E "^$1(-|\$)" || true
}

up() {
  local run=$1
  shift
  valid_run "$run"
  local loopback_self="" domain=""
  local names=()
  while [ $# -gt 0 ]; do
    case $1 in
      --loopback-self) loopback_self=$2; shift 2 ;;
      --domain) domain=$2; shift 2 ;;
      *) names+=("$1"); shift ;;
    esac
  done
  [ ${#names[@]} -ge 1 ] && [ ${#names[@]} -le 200 ] || die "give 1 to 200 host names"
  for name in "${names[@]}"; do [ "$name" != sw ] || die "sw names the bridge namespace"; done
  local switch="$run-sw"
  ip netns add "$switch"
  ip -n "$switch" link add br0 type bridge
  ip -n "$switch" link set br0 up
  local i=0 name ns
  for name in "${names[@]}"; do
    i=$((i + 1))
    ns="$run-$name"
    ip netns add "$ns"
    ip -n "$switch" link add "p$i" type veth peer name eth0 netns "$ns"
    ip -n "$switch" link set "p$i" master br0 up
    ip -n "$ns" link set lo up
    ip -n "$ns" addr add "$kIpv4Prefix.$i/24" dev eth0
    ip -n "$ns" addr add "$kIpv6Prefix:$i/64" dev eth0 nodad
    ip -n "$ns" link set eth0 up
  done
  for name in "${names[@]}"; do
    ns="$run-$name"
    mkdir -p "/etc/netns/$ns"
    {
      echo "127.0.0.1 localhost"
      echo "::1 localhost ip6-localhost ip6-loopback"
      i=0
      local other
      for other in "${names[@]}"; do
        i=$((i + 1))
        local aliases="$other" aliases6="$other-v6"
        if [ -n "$domain" ]; then
          aliases="$other.$domain $other"
          aliases6="$other-v6.$domain $other-v6"
        fi
        if [ "$other" = "$name" ] && [ "$other" = "$loopback_self" ]; then
          echo "127.0.1.1 $aliases"
        else
          echo "$kIpv4Prefix.$i $aliases"
        fi
        echo "$kIpv6Prefix:$i $aliases6"
      done
    } >"/etc/netns/$ns/hosts"
  done
}

run_as() {
  local run=$1 name=$2
  shift 2
  valid_run "$run"
  [ $# -ge 1 ] || die "exec: no command"
  # shellcheck disable=SC2016  # $0 and $@ belong to the inner shell
  exec ip netns exec "$run-$name" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$name" "$@"
}

down() {
  local run=$1
  valid_run "$run"
  local ns pid
  for ns in $(namespaces_of "$run"); do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do
      kill -KILL "$pid" 2>/dev/null || true
    done
    ip netns del "$ns" 2>/dev/null || true
    rm -rf "/etc/netns/$ns"
  done
}

sweep() {
  local ns owner
  for ns in $(ip netns list | awk '{print $1}' | grep -E '^dlh[0-9]+-[a-z0-9]+(-|$)' || true); do
    owner=${ns#dlh}
    owner=${owner%%-*}
    if ! kill -0 "$owner" 2>/dev/null; then
      down "$(echo "$ns" | cut -d- -f1-2)"
    fi
  done
}

case ${1:-} in
  check) check ;;
  up) shift; up "$@" ;;
  exec) shift; run_as "$@" ;;
  down) shift; down "$@" ;;
  sweep) sweep ;;
  *) die "usage: named-hosts.sh check | up RUN [--loopback-self NAME] [--domain D] NAME... | exec RUN NAME CMD... | down RUN | sweep" ;;
esac
