#!/usr/bin/env python3
"""Samples a running `courier bench --scenario drain` on PostgreSQL: what the
database's client backends wait on and how the CPU splits between PostgreSQL,
the bench and its `courier bench-worker` processes.

Every INTERVAL seconds it reads /proc (CPU ticks of every process, grouped)
and asks pg_stat_activity, over one long-lived psql, what each active client
backend of the database is doing (wait_event_type:wait_event, or CPU when it
waits on nothing). Samples are grouped by how many `courier bench-worker`
processes were running (0 = the bench's in-process cases and loading), so the
drain.processes_{1,2,4} cases can be told apart. Stops on SIGINT or when the
file named by --until exists; prints one table per group.

    python3 scripts/experiments/drain-sampler.py --url postgres://postgres@127.0.0.1:5432/test &
    courier bench --scenario drain --database-url ... --no-progress; kill -INT %1
"""
import argparse, collections, os, signal, subprocess, sys, time

INTERVAL = 0.2
TICK = os.sysconf("SC_CLK_TCK")
QUERY = ("SELECT coalesce(wait_event_type || ':' || wait_event, 'CPU'), count(*) "
         "FROM pg_stat_activity WHERE backend_type = 'client backend' "
         "AND state = 'active' AND pid <> pg_backend_pid() AND datname = current_database() "
         "GROUP BY 1;\n\\echo __END__\n"
         # Which statements wait on a row or a page: the query's first 70
         # characters (Courier's queries start with a comment naming them).
         "SELECT wait_event, left(regexp_replace(query, '\\s+', ' ', 'g'), 70) "
         "FROM pg_stat_activity WHERE wait_event IN ('transactionid', 'tuple', 'BufferContent') "
         "AND pid <> pg_backend_pid() AND datname = current_database();\n\\echo __END__\n")


def processes(sampler_pids):
    """(pid, group, ticks) of every process: postgres, bench, bench-worker,
    sampler (this script and its psql), other. A process that ends between
    two samples loses its last interval's ticks (they go to its parent's
    cutime, not read)."""
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        ticks = int(fields[11]) + int(fields[12])
        argv0 = os.path.basename(cmd.split(" ", 1)[0])
        if int(pid) in sampler_pids:
            group = "sampler"
        elif "bench-worker" in cmd:
            group = "bench-worker"
        elif "courier" in argv0 and " bench" in cmd:
            group = "bench"
        elif argv0 == "postgres" or cmd.startswith("postgres:"):
            group = "postgres"
        else:
            group = "other"
        out.append((int(pid), group, ticks))
    return out


def total_ticks():
    with open("/proc/stat") as f:
        parts = f.readline().split()[1:]
    values = [int(v) for v in parts]
    return sum(values), values[3] + values[4]  # all, idle + iowait


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--until", default=None)
    args = parser.parse_args()
    psql = subprocess.Popen(["psql", "-X", "-At", "-F", "\t", args.url], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, bufsize=1)
    waits = collections.defaultdict(collections.Counter)   # workers -> event -> backends summed
    waiters = collections.defaultdict(collections.Counter)  # workers -> (event, query) -> samples
    samples = collections.Counter()                         # workers -> samples
    cpu = collections.defaultdict(collections.Counter)      # workers -> group -> ticks
    idle = collections.Counter()
    wall = collections.Counter()
    stop = [False]
    signal.signal(signal.SIGINT, lambda *_: stop.__setitem__(0, True))
    signal.signal(signal.SIGTERM, lambda *_: stop.__setitem__(0, True))
    sampler_pids = {os.getpid(), psql.pid}
    last = {pid: (group, ticks) for pid, group, ticks in processes(sampler_pids)}
    last_total = total_ticks()
    while not stop[0] and not (args.until and os.path.exists(args.until)):
        time.sleep(INTERVAL)
        now = processes(sampler_pids)
        workers = sum(1 for _, group, _ in now if group == "bench-worker")
        for pid, group, ticks in now:
            before = last.get(pid, (group, ticks if pid in last else 0))[1]
            cpu[workers][group] += max(0, ticks - before)
        last = {pid: (group, ticks) for pid, group, ticks in now}
        total = total_ticks()
        wall[workers] += total[0] - last_total[0]
        idle[workers] += total[1] - last_total[1]
        last_total = total
        psql.stdin.write(QUERY)
        while True:
            line = psql.stdout.readline()
            if not line or line.strip() == "__END__":
                break
            event, count = line.rstrip("\n").split("\t")
            waits[workers][event] += int(count)
        while True:
            line = psql.stdout.readline()
            if not line or line.strip() == "__END__":
                break
            event, query = line.rstrip("\n").split("\t", 1)
            waiters[workers][(event, query)] += 1
        samples[workers] += 1
    psql.stdin.close()
    for workers in sorted(samples):
        n = samples[workers]
        print(f"\n## bench-worker processes: {workers} ({n} samples, {n * INTERVAL:.0f} s)")
        all_ticks = wall[workers] or 1
        print("CPU (share of both cores):", ", ".join(
            f"{g} {100 * t / all_ticks:.0f} %" for g, t in cpu[workers].most_common()),
            f", idle {100 * idle[workers] / all_ticks:.0f} %")
        busy = sum(waits[workers].values())
        print(f"active client backends, mean {busy / n:.2f}:")
        for event, count in waits[workers].most_common(12):
            print(f"  {event:40s} {count / n:6.2f}  ({100 * count / max(busy, 1):.0f} %)")
        if waiters[workers]:
            print("waiting on a row or a page (backend samples, statement):")
            for (event, query), count in waiters[workers].most_common(8):
                print(f"  {count:5d}  {event:14s} {query}")


if __name__ == "__main__":
    main()
