"""Where a profiled pretrain step's time goes, per host thread: the top-level operators of each thread inside the
torch.profiler steps (a chrome trace from train.profile_steps, the pretrain output's profile/trace.json), and the
GPU's busy time. Usage: python trace_threads.py trace.json[.gz]"""
import collections
import gzip
import json
import sys

path = sys.argv[1]
events = json.load(gzip.open(path) if path.endswith(".gz") else open(path))["traceEvents"]
spans = [e for e in events if e.get("ph") == "X"]
steps = sorted((e for e in spans if str(e.get("name", "")).startswith("ProfilerStep#")
                and e.get("cat") == "user_annotation"), key=lambda e: e["ts"])
t0, t1, n = steps[0]["ts"], steps[-1]["ts"] + steps[-1]["dur"], len(steps)
print(f"{n} steps, wall ms each: {[round(e['dur'] / 1000, 1) for e in steps]}")
gpu = sum(e["dur"] for e in spans if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and t0 <= e["ts"] <= t1)
launches = sum(1 for e in spans if e.get("cat") == "cuda_runtime" and "LaunchKernel" in e["name"] and t0 <= e["ts"] <= t1)
print(f"per step: wall {(t1 - t0) / n / 1000:.1f} ms, GPU busy {gpu / n / 1000:.1f} ms, {launches / n:.0f} kernel launches")
threads = collections.defaultdict(list)
for e in spans:
    if e.get("cat") in ("cpu_op", "user_annotation", "python_function") and t0 <= e["ts"] <= t1 \
            and not str(e["name"]).startswith("ProfilerStep"):
        threads[(e["pid"], e["tid"])].append(e)
for key, ops in threads.items():
    ops.sort(key=lambda e: (e["ts"], -e["dur"]))
    top, end = [], -1
    for e in ops:  # top-level: not inside the previous one
        if e["ts"] >= end:
            top.append(e)
            end = e["ts"] + e["dur"]
    totals = collections.Counter()
    for e in top:
        totals[e["name"]] += e["dur"]
    busy = sum(totals.values()) / n / 1000
    if busy > 0.5:
        print(f"thread {key[1]}: busy {busy:.1f} ms per step; top: "
              + ", ".join(f"{name[:48]} {v / n / 1000:.2f}" for name, v in totals.most_common(6)))
