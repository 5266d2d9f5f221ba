#!/usr/bin/env bash
# Run a throwaway Docker distribution registry on a free loopback port, with all
# of its state (config, blobs, log, pid, port) confined to one directory, so
# tests can start as many as they like without touching /etc/docker/registry
# or Debian's system service.
# Usage: scripts/registry.sh start DIR   -> prints 127.0.0.1:PORT
#        scripts/registry.sh stop DIR
set -euo pipefail

usage() {
  echo "usage: $0 start|stop DIR" >&2
  exit 2
}

die() {
  echo "registry.sh: $*" >&2
  exit 1
}

# A pid file can outlive its process and the pid be reused; only treat it as
# ours if that process is docker-registry serving this DIR's config.
is_our_registry() {
  local pid=$1 cfg=$2 cmdline
  [[ -r /proc/$pid/cmdline ]] || return 1
  cmdline="$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null)" || return 1
  [[ $cmdline == *docker-registry*" serve $cfg"* ]]
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
YAML
}

wait_exit() {
  local pid=$1 cfg=$2 i
  for ((i = 0; i < 100; i++)); do
    is_our_registry "$pid" "$cfg" || return 0
    sleep 0.1
  done
  return 1
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
    if is_our_registry "$pid" "$cfg" &&
      curl -fsS -o /dev/null "http://127.0.0.1:$port/v2/" 2>/dev/null; then
      echo "127.0.0.1:$port"
      return 0
    fi
  fi

  command -v docker-registry >/dev/null 2>&1 ||
    die "docker-registry not found; run scripts/install-deps.sh"
  command -v curl >/dev/null 2>&1 ||
    die "curl not found; run scripts/install-deps.sh"
  mkdir -p "$dir/data"

  # The registry merges REGISTRY_* environment variables over its config; a
  # stray one from the caller would silently change where it listens or stores.
  local v
  while IFS= read -r v; do
    [[ $v == REGISTRY_* ]] && unset "$v"
  done < <(compgen -e)

  for ((attempt = 1; attempt <= 5; attempt++)); do
    port="$(free_port)"
    # Only this attempt's log lines say why it failed; earlier ones may not.
    logoff=$(($(stat -c %s "$dir/registry.log" 2>/dev/null || echo 0) + 1))
    write_config "$dir" "$port"
    # Detach fully: the registry must not hold the caller's terminal or pipes
    # (e.g. `addr=$(registry.sh start d)` or a test harness waiting for EOF
    # would hang), and must not get the caller's job-control signals. Besides
    # stdio, a caller may have leaked other pipe fds to us, so close every fd
    # above 2 too. A non-interactive shell's background job is not a process
    # group leader, so setsid execs in place and $! is the registry itself.
    (
      for fdpath in /proc/self/fd/*; do
        fd=${fdpath##*/}
        if ((fd > 2)); then
          exec {fd}>&- 2>/dev/null || true
        fi
      done
      exec setsid docker-registry serve "$cfg" </dev/null >>"$dir/registry.log" 2>&1
    ) &
    pid=$!
    echo "$pid" >"$dir/pid"
    echo "$port" >"$dir/port"

    for ((i = 0; i < 100; i++)); do
      if curl -fsS -o /dev/null "http://127.0.0.1:$port/v2/" 2>/dev/null; then
        echo "127.0.0.1:$port"
        return 0
      fi
      # Not `kill -0`: a crashed child stays a zombie until reaped and would
      # look alive; a zombie has an empty cmdline, which this check rejects.
      is_our_registry "$pid" "$cfg" || break
      sleep 0.1
    done

    if is_our_registry "$pid" "$cfg"; then
      # Alive but never answered within 10 s: not a port race, so retrying
      # would only hide the problem.
      kill "$pid" 2>/dev/null || true
      wait_exit "$pid" "$cfg" || kill -9 "$pid" 2>/dev/null || true
      rm -f "$dir/pid" "$dir/port"
      die "registry on 127.0.0.1:$port did not answer within 10s; see $dir/registry.log"
    fi
    wait "$pid" 2>/dev/null || true
    rm -f "$dir/pid" "$dir/port"
    if ! tail -c "+$logoff" "$dir/registry.log" | grep -q 'address already in use'; then
      tail -c "+$logoff" "$dir/registry.log" | tail -n 20 >&2 || true
      die "registry exited during startup; see $dir/registry.log"
    fi
    echo "registry.sh: port $port taken, retrying" >&2
  done
  die "could not find a free port after $((attempt - 1)) attempts"
}

stop() {
  local dir=$1 cfg pid
  [[ -d $dir ]] || return 0
  dir="$(cd "$dir" && pwd -P)"
  cfg="$dir/config.yml"
  [[ -s $dir/pid ]] || return 0
  pid="$(<"$dir/pid")"
  if is_our_registry "$pid" "$cfg"; then
    kill "$pid" 2>/dev/null || true
    if ! wait_exit "$pid" "$cfg"; then
      kill -9 "$pid" 2>/dev/null || true
      wait_exit "$pid" "$cfg" || die "registry pid $pid would not exit"
    fi
    # It has exited, but stays a zombie until init reaps it; give init a
    # moment so callers checking the process table right after see it gone.
    local i
    for ((i = 0; i < 20; i++)); do
      [[ -e /proc/$pid ]] || break
      sleep 0.1
    done
  fi
  rm -f "$dir/pid" "$dir/port"
}

(($# == 2)) || usage
case $1 in
  start) start "$2" ;;
  stop) stop "$2" ;;
  *) usage ;;
esac
