#!/usr/bin/env bash
# Run a throwaway Docker distribution registry on a free loopback port, with all
# of its state (config, blobs, log, pid, port) confined to one directory, so
# tests can start as many as they like without touching /etc/docker/registry
# or Debian's system service.
#
# With --token-auth it also runs scripts/token-server.py on another free
# loopback port and makes the registry demand Docker Hub style Bearer tokens
# from it: anonymous callers may pull, USER:PASSWORD may pull and push. The
# token server's key and certificate, pid, port, log and request log
# (token.key, token.crt, token.pid, token.port, token.log,
# token-requests.log) live in DIR too, and stop DIR stops it as well.
# Repositories under private/ get no anonymous access at all: pulling them
# needs USER:PASSWORD (for imagePullSecrets tests).
#
# Usage: scripts/registry.sh start DIR   -> prints 127.0.0.1:PORT
#        scripts/registry.sh start DIR --token-auth USER:PASSWORD
#        scripts/registry.sh stop DIR
set -euo pipefail

usage() {
  echo "usage: $0 start DIR [--token-auth USER:PASSWORD] | stop DIR" >&2
  exit 2
}

# Fixed names so tests can assert on the challenge and the token claims.
TOKEN_SERVICE=nanolet-test-registry
TOKEN_ISSUER=nanolet-test-issuer
# How long a started registry may take to answer.
READY_WAIT=30
TOKEN_SERVER="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)/token-server.py"
# USER:PASSWORD when started with --token-auth, empty for an open registry.
token_auth=""

die() {
  echo "registry.sh: $*" >&2
  exit 1
}

# A pid file can outlive its process and the pid be reused; only treat it as
# ours if that process is docker-registry serving this DIR's config.
is_our_registry() {
  local pid=$1 cfg=$2 cmdline
  [[ -r /proc/$pid/cmdline ]] || return 1
  # The process may end between the test and the read: no noise then.
  cmdline="$({ tr '\0' ' ' <"/proc/$pid/cmdline"; } 2>/dev/null)" || return 1
  [[ $cmdline == *docker-registry*" serve $cfg"* ]]
}

# Same guard for the token server, which is identified by the port file it
# was told to write, as that names this DIR.
is_our_token_server() {
  local pid=$1 dir=$2 cmdline
  [[ -r /proc/$pid/cmdline ]] || return 1
  # Silence first: the process may vanish between the test and the read.
  cmdline="$(tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline")" || return 1
  [[ $cmdline == *token-server.py*" --port-file $dir/token.port "* ]]
}

# The USER:PASSWORD a running token server was given, to decide whether it
# can be reused for a start that asks for the same credentials.
token_server_creds() {
  local pid=$1 i args=()
  mapfile -d '' -t args 2>/dev/null <"/proc/$pid/cmdline" || return 0
  for ((i = 0; i + 1 < ${#args[@]}; i++)); do
    if [[ ${args[i]} == --user ]]; then
      printf '%s' "${args[i + 1]}"
      return 0
    fi
  done
}

free_port() {
  # Binding port 0 lets the kernel pick; the socket is closed before the
  # registry binds, so a race is possible and the caller retries on failure.
  if command -v python3 >/dev/null 2>&1; then
    python3 -c 'import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])'
  else
    echo $((20000 + RANDOM % 20000))
  fi
}

yaml_quote() {
  # Single-quoted YAML scalars only need embedded quotes doubled.
  printf "'%s'" "${1//\'/\'\'}"
}

write_config() {
  local dir=$1 port=$2
  cat >"$dir/config.yml" <<YAML
version: 0.1
log:
  level: warn
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: $(yaml_quote "$dir/data")
  delete:
    enabled: true
http:
  addr: 127.0.0.1:$port
  # A fixed secret only silences the "generated random secret" warning; it
  # guards upload state, which is meaningless for a single loopback instance.
  secret: nanolet-local-test-registry
# Foreign (non-distributable) layers may name loopback URLs, where tests
# serve them; the default allows none.
validation:
  manifests:
    urls:
      allow:
        - '^http://127\.0\.0\.1:[0-9]+/'
YAML
}

# Appended to the config only in --token-auth mode, so an open registry's
# config stays exactly what it always was.
write_token_auth() {
  local dir=$1 token_port=$2
  cat >>"$dir/config.yml" <<YAML
auth:
  token:
    realm: $(yaml_quote "http://127.0.0.1:$token_port/token")
    service: $TOKEN_SERVICE
    issuer: $TOKEN_ISSUER
    rootcertbundle: $(yaml_quote "$dir/token.crt")
YAML
}

# Ready means answering /v2/ as configured: 200 when open, and 401 (the
# Bearer challenge) when it demands tokens.
registry_ready() {
  local port=$1
  if [[ -z $token_auth ]]; then
    curl -fsS -o /dev/null "http://127.0.0.1:$port/v2/" 2>/dev/null
  else
    [[ "$(curl -sS -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/v2/" 2>/dev/null)" == 401 ]]
  fi
}

# Run a command fully detached: it must not hold the caller's terminal or
# pipes (e.g. `addr=$(registry.sh start d)` or a test harness waiting for EOF
# would hang), and must not get the caller's job-control signals. Besides
# stdio, a caller may have leaked other pipe fds to us, so close every fd
# above 2 too. Meant to be run as `detached LOG CMD... &`: a non-interactive
# shell's background job is not a process group leader, so setsid execs in
# place and $! is the command itself.
detached() {
  local log=$1 fdpath fd
  shift
  for fdpath in /proc/self/fd/*; do
    fd=${fdpath##*/}
    if ((fd > 2)); then
      exec {fd}>&- 2>/dev/null || true
    fi
  done
  exec setsid "$@" </dev/null >>"$log" 2>&1
}

# Whether our own, not yet reaped, child is still running. Right after the
# fork it is still a copy of this shell, so the cmdline checks above would
# wrongly call it gone; a child's pid cannot be reused before we reap it.
child_running() {
  local stat
  { read -r stat <"/proc/$1/stat"; } 2>/dev/null || return 1
  stat=${stat##*) }
  [[ ${stat%% *} != [ZX] ]]
}

# CHECK is is_our_registry or is_our_token_server, ARG its second argument.
wait_exit() {
  local check=$1 pid=$2 arg=$3 i
  for ((i = 0; i < 100; i++)); do
    "$check" "$pid" "$arg" || return 0
    sleep 0.1
  done
  return 1
}

# TERM, then KILL if it lingers, and wait until the pid is really gone.
terminate() {
  local check=$1 pid=$2 arg=$3 what=$4 i
  "$check" "$pid" "$arg" || return 0
  kill "$pid" 2>/dev/null || true
  if ! wait_exit "$check" "$pid" "$arg"; then
    kill -9 "$pid" 2>/dev/null || true
    wait_exit "$check" "$pid" "$arg" || die "$what pid $pid would not exit"
  fi
  # It has exited, but stays a zombie until init reaps it; give init a
  # moment so callers checking the process table right after see it gone.
  for ((i = 0; i < 20; i++)); do
    [[ -e /proc/$pid ]] || break
    sleep 0.1
  done
}

stop_token_server() {
  local dir=$1
  if [[ -s $dir/token.pid ]]; then
    terminate is_our_token_server "$(<"$dir/token.pid")" "$dir" "token server"
  fi
  rm -f "$dir/token.pid" "$dir/token.port"
}

# A failure after the token server started must not leave it running.
fail() {
  [[ -z $token_auth ]] || stop_token_server "$1"
  shift
  die "$@"
}

# Fresh key and certificate each start, then the token server on a port it
# binds itself (port 0), so unlike the registry there is no race to retry.
# The password is on its command line: acceptable for a loopback test double.
start_token_server() {
  local dir=$1 pid i
  python3 "$TOKEN_SERVER" --init "$dir" || die "could not create the token signing key in $dir"
  rm -f "$dir/token.port"
  detached "$dir/token.log" python3 "$TOKEN_SERVER" \
    --key "$dir/token.key" --cert "$dir/token.crt" --issuer "$TOKEN_ISSUER" \
    --user "$token_auth" --port-file "$dir/token.port" --private private/ \
    --request-log "$dir/token-requests.log" &
  pid=$!
  echo "$pid" >"$dir/token.pid"
  for ((i = 0; i < 100; i++)); do
    # The port file appears only once the server listens.
    [[ -s $dir/token.port ]] && return 0
    child_running "$pid" || break
    sleep 0.1
  done
  if ! child_running "$pid"; then
    wait "$pid" 2>/dev/null || true
    tail -n 20 "$dir/token.log" >&2 || true
  fi
  fail "$dir" "token server did not start within 10s; see $dir/token.log"
}

start() {
  local dir=$1 cfg pid port attempt i logoff
  mkdir -p "$dir"
  dir="$(cd "$dir" && pwd -P)"
  cfg="$dir/config.yml"

  # Idempotent start: a healthy registry already running here is reused.
  if [[ -s $dir/pid && -s $dir/port ]]; then
    pid="$(<"$dir/pid")"
    port="$(<"$dir/port")"
    if is_our_registry "$pid" "$cfg"; then
      # Reusing, or starting over it, would silently hand the caller a
      # registry with the wrong access rules.
      if grep -q '^auth:' "$cfg"; then
        [[ -n $token_auth ]] || die "$dir runs a token-auth registry; stop it first"
      else
        [[ -z $token_auth ]] || die "$dir runs an open registry; stop it first"
      fi
    fi
    if [[ -z $token_auth ]]; then
      if is_our_registry "$pid" "$cfg" &&
        curl -fsS -o /dev/null "http://127.0.0.1:$port/v2/" 2>/dev/null; then
        echo "127.0.0.1:$port"
        return 0
      fi
    elif is_our_registry "$pid" "$cfg" && registry_ready "$port" &&
      [[ -s $dir/token.pid ]] &&
      is_our_token_server "$(<"$dir/token.pid")" "$dir" &&
      [[ "$(token_server_creds "$(<"$dir/token.pid")")" == "$token_auth" ]]; then
      echo "127.0.0.1:$port"
      return 0
    fi
  fi
  # Half a token-auth setup (or other credentials) is not reusable: start over.
  [[ -z $token_auth ]] || stop "$dir"

  command -v docker-registry >/dev/null 2>&1 ||
    die "docker-registry not found; run scripts/install-deps.sh"
  command -v curl >/dev/null 2>&1 ||
    die "curl not found; run scripts/install-deps.sh"
  if [[ -n $token_auth ]]; then
    command -v python3 >/dev/null 2>&1 ||
      die "python3 not found; it runs scripts/token-server.py"
    command -v openssl >/dev/null 2>&1 ||
      die "openssl not found; token-server.py signs tokens with it"
  fi
  mkdir -p "$dir/data"

  # The registry merges REGISTRY_* environment variables over its config; a
  # stray one from the caller would silently change where it listens or stores.
  local v
  while IFS= read -r v; do
    [[ $v == REGISTRY_* ]] && unset "$v"
  done < <(compgen -e)

  local token_port=""
  if [[ -n $token_auth ]]; then
    stop_token_server "$dir"
    start_token_server "$dir"
    token_port="$(<"$dir/token.port")"
  fi

  for ((attempt = 1; attempt <= 5; attempt++)); do
    port="$(free_port)"
    # Only this attempt's log lines say why it failed; earlier ones may not.
    logoff=$(($(stat -c %s "$dir/registry.log" 2>/dev/null || echo 0) + 1))
    write_config "$dir" "$port"
    [[ -z $token_auth ]] || write_token_auth "$dir" "$token_port"
    detached "$dir/registry.log" docker-registry serve "$cfg" &
    pid=$!
    echo "$pid" >"$dir/pid"
    echo "$port" >"$dir/port"

    # By the clock, not a count of tries: on two cores busy with the
    # suite's release builds, a start took more than 10 s.
    local deadline=$((SECONDS + READY_WAIT))
    while ((SECONDS < deadline)); do
      if registry_ready "$port"; then
        echo "127.0.0.1:$port"
        return 0
      fi
      # Not `kill -0`: a crashed child stays a zombie until reaped and would
      # look alive; a zombie has an empty cmdline, which this check rejects.
      is_our_registry "$pid" "$cfg" || break
      sleep 0.1
    done

    if is_our_registry "$pid" "$cfg"; then
      # Alive but never answered: not a port race, so retrying would only
      # hide the problem. Its log is shown: the caller may remove the dir.
      kill "$pid" 2>/dev/null || true
      wait_exit is_our_registry "$pid" "$cfg" || kill -9 "$pid" 2>/dev/null || true
      rm -f "$dir/pid" "$dir/port"
      tail -c "+$logoff" "$dir/registry.log" | tail -n 20 >&2 || true
      fail "$dir" "registry on 127.0.0.1:$port did not answer within ${READY_WAIT}s; see $dir/registry.log"
    fi
    wait "$pid" 2>/dev/null || true
    rm -f "$dir/pid" "$dir/port"
    if ! tail -c "+$logoff" "$dir/registry.log" | grep -q 'address already in use'; then
      tail -c "+$logoff" "$dir/registry.log" | tail -n 20 >&2 || true
      fail "$dir" "registry exited during startup; see $dir/registry.log"
    fi
    echo "registry.sh: port $port taken, retrying" >&2
  done
  fail "$dir" "could not find a free port after $((attempt - 1)) attempts"
}

stop() {
  local dir=$1
  [[ -d $dir ]] || return 0
  dir="$(cd "$dir" && pwd -P)"
  if [[ -s $dir/pid ]]; then
    terminate is_our_registry "$(<"$dir/pid")" "$dir/config.yml" registry
    rm -f "$dir/pid" "$dir/port"
  fi
  # Registry first, so it never runs without its token server; also when the
  # registry is already gone, the token server may not be.
  stop_token_server "$dir"
}

(($# >= 2)) || usage
case $1 in
  start)
    if (($# == 4)) && [[ $3 == --token-auth ]]; then
      # A colon after a non-empty user; the password may contain colons.
      [[ $4 == ?*:* ]] || die "--token-auth needs USER:PASSWORD"
      token_auth=$4
    elif (($# != 2)); then
      usage
    fi
    start "$2"
    ;;
  stop)
    (($# == 2)) || usage
    stop "$2"
    ;;
  *) usage ;;
esac
