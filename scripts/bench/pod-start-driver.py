#!/usr/bin/env python3
"""Measures one runtime's pod starts for scripts/bench/pod-start.sh.

  pod-start-driver.py WORK IMAGE AGENT_PID PODS RUNTIME PODMAN_ARG...
      starts PODS pods through nanolet (manifests in WORK/manifests), then
      PODS through `podman kube play`, and prints one JSON line of results.
  pod-start-driver.py --report RESULTS_JSONL RUNC_MICROSECONDS...
      prints the summary and the BENCH lines.
"""
import glob
import json
import os
import statistics
import subprocess
import sys
import time


def rss_kib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def pss_kib(pid):
    """The process's proportional share of its pages: shared pages (the
    binary, libraries) count once across processes, unlike RSS."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def launchers(agent):
    """The agent's monitor launcher (a fork of it that forks the monitors):
    its memory is the agent's and the monitors' too."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            stat = open(f"/proc/{pid}/stat").read()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        if comm == "nanolet-launch" and ppid == agent:
            found.append(int(pid))
    return found


def p95(values):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(0.95 * (len(ordered) - 1))))]


def pod_text(name, image, extra_spec=""):
    return (f"apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n{extra_spec}"
            f"  terminationGracePeriodSeconds: 0\n"
            f"  containers:\n  - name: c\n    image: {image}\n    command: [sleep, '3600']\n")


def pod_running(work, name):
    """Whether the agent's status file of pod NAME shows all its containers running."""
    for path in glob.glob(os.path.join(work, "state/pods/*/status.json")):
        try:
            record = json.load(open(path))
        except (OSError, ValueError):
            continue
        if record.get("name") != name:
            continue
        statuses = record["status"].get("containerStatuses") or []
        return bool(statuses) and all("running" in (s.get("state") or {}) for s in statuses)
    return False


def wait_until(check, work, timeout=60):
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            sys.exit(f"timed out; see the agent log in {work}")
        time.sleep(0.002)


def measure(work, image, agent, pods, runtime, podman_args):
    manifests = os.path.join(work, "manifests")

    def monitors(measure):
        total = 0
        for path in glob.glob(os.path.join(work, "state/pods/*/monitor.pid")):
            try:
                total += measure(int(open(path).read()))
            except (OSError, ValueError):
                pass
        return total

    def running(name):
        return pod_running(work, name)

    def write_pod(name):
        tmp = os.path.join(manifests, f".{name}.tmp")
        with open(tmp, "w") as f:
            f.write(pod_text(name, image))
        os.rename(tmp, os.path.join(manifests, f"{name}.yaml"))

    # Warm-up: pulls the image, so that every measured pod has it present.
    write_pod("warmup")
    wait_until(lambda: running("warmup"), work)
    os.remove(os.path.join(manifests, "warmup.yaml"))
    wait_until(lambda: not glob.glob(os.path.join(work, "state/pods/*")), work)
    time.sleep(2)
    result = {"runtime": runtime, "rss_idle": rss_kib(agent)}

    nanolet_us = []
    for i in range(pods):
        name = f"bench-{i}"
        start = time.monotonic()
        write_pod(name)
        wait_until(lambda: running(name), work)
        nanolet_us.append(int((time.monotonic() - start) * 1e6))
        if i + 1 in (10, 30):
            time.sleep(2)
            agents = [agent, *launchers(agent)]
            result[f"nanolet_kib_{i + 1}"] = sum(map(pss_kib, agents)) + monitors(pss_kib)
            result[f"nanolet_rss_{i + 1}"] = sum(map(rss_kib, agents)) + monitors(rss_kib)
    result["nanolet_median"] = statistics.median(nanolet_us) / 1000
    result["nanolet_p95"] = p95(nanolet_us) / 1000

    podman = ["podman", *podman_args, "--runtime", runtime]
    yaml_dir = os.path.join(work, "podman-pods")
    os.makedirs(yaml_dir, exist_ok=True)

    def play(name):
        path = os.path.join(yaml_dir, f"{name}.yaml")
        with open(path, "w") as f:
            f.write(pod_text(name, image))
        start = time.monotonic()
        done = subprocess.run([*podman, "kube", "play", "--tls-verify=false", "--network", "none",
                               path], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if done.returncode != 0:
            sys.exit(f"podman kube play {name}: exit {done.returncode}: {done.stderr.strip()}")
        return int((time.monotonic() - start) * 1e6)

    def conmons(measure):
        total = 0
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                cmdline = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
            except OSError:
                continue
            if cmdline and cmdline[0].endswith(b"conmon") and work.encode() in b" ".join(cmdline):
                total += measure(pid)
        return total

    # Warm-up: pulls the image and builds podman's pause image.
    play("warmup")
    subprocess.run([*podman, "pod", "rm", "-f", "-t", "0", "warmup"], check=True,
                   stdout=subprocess.DEVNULL)
    podman_us = []
    for i in range(pods):
        podman_us.append(play(f"bench-{i}"))
        if i + 1 in (10, 30):
            time.sleep(2)
            result[f"podman_kib_{i + 1}"] = conmons(pss_kib)
            result[f"podman_rss_{i + 1}"] = conmons(rss_kib)
    result["podman_median"] = statistics.median(podman_us) / 1000
    result["podman_p95"] = p95(podman_us) / 1000
    return result


def report(results_path, runc_us):
    results = [json.loads(line) for line in open(results_path)]
    r_med = statistics.median(runc_us) / 1000
    for r in results:
        rt = r["runtime"]
        print(f"{rt}: nanolet pod start median {r['nanolet_median']:.1f} ms, "
              f"p95 {r['nanolet_p95']:.1f} ms; podman kube play median "
              f"{r['podman_median']:.1f} ms, p95 {r['podman_p95']:.1f} ms")
        for n in (10, 30):
            print(f"{rt}: memory at {n} pods, PSS (RSS): nanolet agent + launcher + monitors "
                  f"{r[f'nanolet_kib_{n}']} ({r[f'nanolet_rss_{n}']}) KiB, podman conmons "
                  f"{r[f'podman_kib_{n}']} ({r[f'podman_rss_{n}']}) KiB; per pod "
                  f"{r[f'nanolet_kib_{n}'] / n:.0f} vs {r[f'podman_kib_{n}'] / n:.0f} KiB PSS")
    print(f"runc run -d of the same rootfs: median {r_med:.1f} ms")
    first = results[0]
    print(f"BENCH pod-start-vs-podman {first['nanolet_median'] / first['podman_median']:.2f}")
    print(f"BENCH memory-30-pods {first['nanolet_kib_30']} KiB")
    print(f"BENCH pod-start-vs-runc {first['nanolet_median'] / r_med:.2f}")
    print(f"BENCH rss-idle {first['rss_idle']} KiB")


def main():
    if sys.argv[1] == "--report":
        report(sys.argv[2], [int(x) for x in sys.argv[3:]])
        return
    work, image, agent, pods, runtime = sys.argv[1:6]
    result = measure(work, image, int(agent), int(pods), runtime, sys.argv[6:])
    print(json.dumps(result))


if __name__ == "__main__":
    main()
