# shellcheck shell=bash disable=SC2034 # TW_ARGS, TW_SHARDS, TW_BUCKET_MS are for the scripts
# Sourced by the scripts of deploy/redis-cli (docs/operations/redis-cli.md).
#
# Arguments: redis-cli's own options first (-h -p -a --user --pass --tls --cacert -u ...),
# then `--`, then the script's arguments. With no redis-cli options the `--` may be
# left out: then arguments are the script's unless the first starts with '-'.
# Environment: TIMEWHEEL_PREFIX (key prefix, default tw), REDIS_CLI (the redis-cli to
# run, default redis-cli), REDISCLI_AUTH (the password, read by redis-cli itself).
#
# Every read of keys is a Lua snippet of lua/ sent with redis-cli --eval under
# '#!lua flags=no-writes', so Redis refuses any write the snippet might attempt. Each
# call reads one shard (its keys share one hash tag) and is sent with -c, so on a
# Cluster any node will do: redis-cli follows the redirection to the shard's primary.
set -euo pipefail

TW_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TW_PREFIX="${TIMEWHEEL_PREFIX:-tw}"
TW_CLI="${REDIS_CLI:-redis-cli}"
TW_NAME="$(basename "$0")"
TW_FLAGS=()
TW_ARGS=()

tw_die() {
  echo "$TW_NAME: $*" >&2
  exit 1
}

tw_usage() {
  # TW_USAGE is set by the script before it sources this file.
  # shellcheck disable=SC2154
  printf 'usage: %s [redis-cli options] [--] %s\n' "$TW_NAME" "$TW_USAGE" >&2
  exit 2
}

# Split "$@" into TW_FLAGS (for redis-cli) and TW_ARGS (the script's).
tw_parse() {
  if [ "${1:-}" = "--help" ]; then
    tw_usage
  fi
  local seen=0 arg
  for arg in "$@"; do
    if [ "$arg" = "--" ]; then
      seen=1
      break
    fi
  done
  if [ "$seen" -eq 1 ]; then
    while [ "$1" != "--" ]; do
      TW_FLAGS+=("$1")
      shift
    done
    shift
    TW_ARGS=("$@")
  elif [ "$#" -gt 0 ] && [ "${1:0:1}" = "-" ]; then
    TW_FLAGS=("$@")
  else
    TW_ARGS=("$@")
  fi
  case "$TW_PREFIX" in
    *[!A-Za-z0-9_.-]* | "") tw_die "TIMEWHEEL_PREFIX must be letters, digits, _ . - (got '$TW_PREFIX')" ;;
  esac
}

# A tenant or queue name as timewheel accepts them (they are parts of key names).
tw_check_name() {
  local what="$1" value="$2"
  if ! [[ "$value" =~ ^[A-Za-z0-9_.-]{1,64}$ ]]; then
    tw_die "$what must be 1-64 characters of A-Z a-z 0-9 _ . - (got '$value')"
  fi
}

tw_check_count() {
  local what="$1" value="$2"
  if ! [[ "$value" =~ ^[0-9]{1,9}$ ]]; then
    tw_die "$what must be a whole number (got '$value')"
  fi
}

# The key tag of shard $1: {<prefix>:<n>}:
tw_tag() {
  printf '{%s:%d}:' "$TW_PREFIX" "$1"
}

# redis-cli with the caller's options (later options win, so -c and --raw hold).
tw_cli() {
  "$TW_CLI" "${TW_FLAGS[@]}" "$@"
}

# Run snippet lua/$1.lua: tw_eval NAME KEY... [, ARG...]. Prints its lines (without the
# leading 'ok'); an error reply or a failed connection ends the script with status 1.
tw_eval() {
  local name="$1" out
  shift
  if ! out="$(tw_cli -c --raw --eval <(
    printf '#!lua flags=no-writes\n'
    cat "$TW_ROOT/lua/common.lua" "$TW_ROOT/lua/$name.lua"
  ) "$@")"; then
    tw_die "redis-cli failed${out:+: $out}"
  fi
  if [ "${out%%$'\n'*}" != "ok" ]; then
    tw_die "$out"
  fi
  if [ "$out" != "ok" ]; then
    printf '%s\n' "${out#ok$'\n'}"
  fi
}

# The deployment's layout: sets TW_SHARDS and TW_BUCKET_MS from <prefix>:layout.
tw_layout() {
  local line
  line="$(tw_eval layout "$TW_PREFIX:layout")"
  read -r TW_SHARDS TW_BUCKET_MS <<<"$line"
}

# "host port" of every primary of a Cluster (those merely suspected of failing, fail?,
# included); nothing on a standalone server.
tw_primaries() {
  local info
  info="$(tw_cli --raw INFO cluster 2>&1)" || tw_die "redis-cli failed: $info"
  case "$info" in
    *cluster_enabled:1*) ;;
    *cluster_enabled:0*) return 0 ;;
    *) tw_die "INFO cluster: $info" ;;
  esac
  tw_cli --raw CLUSTER NODES | awk '$3 ~ /master/ && $3 !~ /(^|,)fail(,|$)/ {
    addr = $2; sub(/@.*/, "", addr); port = addr; sub(/.*:/, "", port); sub(/:[^:]*$/, "", addr)
    print addr, port
  }'
}

# Every key matching pattern $1 on one server (SCAN, 1,000 keys a step: it never blocks
# Redis for long); extra arguments are redis-cli options naming the server.
tw_scan_server() {
  local pattern="$1" cursor=0 out
  shift
  while :; do
    out="$(tw_cli "$@" --raw SCAN "$cursor" MATCH "$pattern" COUNT 1000)" ||
      tw_die "redis-cli failed${out:+: $out}"
    cursor="${out%%$'\n'*}"
    [[ "$cursor" =~ ^[0-9]+$ ]] || tw_die "SCAN: $out"
    if [ "$out" != "$cursor" ]; then
      printf '%s\n' "${out#*$'\n'}"
    fi
    [ "$cursor" != 0 ] || break
  done
}

# Every key matching pattern $1, sorted: of the server, or of every primary of a Cluster.
tw_scan() {
  local pattern="$1" nodes host port
  nodes="$(tw_primaries)"
  {
    if [ -z "$nodes" ]; then
      tw_scan_server "$pattern"
    else
      while read -r host port; do
        tw_scan_server "$pattern" -h "$host" -p "$port"
      done <<<"$nodes"
    fi
  } | sort -u
}

# The shard number in a key of one shard.
tw_shard_of() {
  local rest="${1#\{"$TW_PREFIX":}"
  printf '%s\n' "${rest%%\}*}"
}
