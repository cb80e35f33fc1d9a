"""Worker scaling of the sharded release: 1 vs N SDK workers, multi-process runner and portable path.

The sharded ``ContinualCount`` of ``scale.py`` (K declared keys, S hourly
steps, two events per key and step, the fixed noise key ``BENCH_KEY``) runs
with 1 worker and with N workers in each mode:

* ``multi_processing``: the in-process ``FnApiRunner`` with
  ``--direct_num_workers`` SDK worker subprocesses
  (``--direct_running_mode multi_processing``);
* ``portable``: ``PortableRunner`` against a local job service and an
  external SDK worker pool (``worker_pool_main``), both started here as
  subprocesses, how Flink or Dataflow run Python. Beam's stock
  ``local_job_service_main`` always runs one worker per environment: its
  ``FnApiRunner`` reads ``--direct_num_workers`` only when it is handed a
  ``Pipeline`` object, never on the job-service path, and nothing there
  reads ``--sdk_worker_parallelism``. So the job service used here is the
  stock servicer whose jobs honour ``--direct_num_workers`` (started as
  ``python benchmarks/parallel.py --serve-jobs PORT``);
* ``portable-stock`` (not run by default): the stock job service, given
  ``--direct_num_workers N --sdk_worker_parallelism N``; it shows that one
  worker does all the work.

Inputs (``--inputs``): ``create`` is the input of ``scale.py``, one
``Create`` without reshuffle; its single impulse element makes the whole
first stage (reading, stamping, routing the events to their shards) run on
one worker, and only the stage after the grouping by shard is split between
workers (by the runner, round-robin over shards). ``spread`` makes the same
events in the workers, from 16 key ranges after a reshuffle, so that the
first stage is split too.

Every release is written with the process id of the worker that released
it (``released by``: how many distinct workers released). The CPU seconds
of the processes of a run are sampled from ``/proc`` (Linux only): this
process (the pipeline's construction; for ``multi_processing`` also the
runner, through which every element between two stages passes), the job
service (the runner of the portable modes) and each SDK worker started for
the run. The released (key, step, value) sets of all runs must be
identical. The runs of all modes, inputs and worker counts are interleaved;
wall and CPU seconds are medians of ``--repeats`` runs; speed-up is the
1-worker wall time over the N-worker one; ``cores used`` is the CPU seconds
of all these processes per wall second (on a machine shared with other
work, a run with N workers may get fewer than N cores: the cores that N
busy-looping processes get are printed before and after the runs). Worker
logs go to stderr.

    python benchmarks/parallel.py [--keys 1000] [--steps 72] [--repeats 3] [--workers 2]
        [--modes multi_processing,portable[,portable-stock]] [--inputs create[,spread]]
        2> parallel.log
"""

import argparse
import collections
import contextlib
import json
import os
import statistics
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

import apache_beam as beam  # noqa: E402
from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions  # noqa: E402

# private_transform("sharded", ...) releases with the fixed noise key scale.BENCH_KEY.
from scale import HOUR, _CreateEvents, _stamp, events_for, private_transform  # noqa: E402
from tests.servers import free_port, server, venv_env  # noqa: E402

MODES = ("multi_processing", "portable", "portable-stock")
SOURCES = ("create", "spread")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _tagged(release):
    # The pid of the process that computed the release: which workers did work.
    return json.dumps([release.key, release.step, release.value, os.getpid()])


class _ChunkEvents(beam.DoFn):
    """The events of every ``chunks``-th key from ``chunk`` on (those of ``events_for``)."""

    def __init__(self, keys, steps, chunks):
        self._keys, self._steps, self._chunks = keys, steps, chunks

    def process(self, chunk):
        for k in range(chunk, self._keys, self._chunks):
            for s in range(self._steps):
                for j in range(2):
                    yield f"k{k}", s * HOUR + 60.0 * j, float(j % 5)


def run_release(keys, steps, events, options, sink, source="create", chunks=16):
    """Wall seconds of one run of the sharded count; its releases go to ``sink`` as JSON lines.

    ``create``: the events of ``scale.py``, one ``Create`` without reshuffle, whose
    single impulse makes the whole first stage (reading, stamping, routing to shards)
    run on one worker. ``spread``: the same events made by the workers from
    ``chunks`` key ranges after a reshuffle, so the first stage is split too.
    """
    start = time.perf_counter()
    p = beam.Pipeline(options=options)
    if source == "create":
        raw = p | _CreateEvents(events, reshuffle=False)
    else:
        raw = (p | beam.Create(list(range(chunks)), reshuffle=True)
               | beam.ParDo(_ChunkEvents(keys, steps, chunks)))
    releases = (raw | beam.Map(_stamp) | private_transform("sharded", keys, steps)).releases
    _ = (releases | beam.Map(_tagged) | beam.io.WriteToText(sink, shard_name_template=""))
    p.run().wait_until_finish()
    return time.perf_counter() - start


def read_releases(sink):
    """(sorted (key, step, value) lines, {pid: releases}) of one run's output."""
    lines, per_pid = [], collections.Counter()
    with open(sink) as f:
        for line in f:
            key, step, value, pid = json.loads(line)
            lines.append(json.dumps([key, step, value]))
            per_pid[pid] += 1
    return sorted(lines), per_pid


# ---- CPU time of every process of a run, sampled from /proc --------------------------------

def _cpu_seconds(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            data = f.read()
    except OSError:
        return None
    fields = data[data.rfind(")") + 2:].split()   # the command name may contain spaces
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS   # utime + stime


def _children(pid):
    # Children are listed per thread: the runner starts workers from its own threads.
    found = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                found.extend(int(c) for c in f.read().split())
        except OSError:
            pass
    return found


def _cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


class CpuSampler:
    """Largest CPU seconds seen per descendant process of this one while running.

    SDK workers exit (multi_processing) or linger as zombies (worker pool) after a
    run, so they are polled during it; the last 0.1 s of a worker may be missed.
    """

    def __init__(self, interval=0.1):
        self._interval = interval
        self.cpu, self.cmd = {}, {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self):
        todo = _children(os.getpid())
        while todo:
            pid = todo.pop()
            seconds = _cpu_seconds(pid)
            if seconds is None:
                continue
            if pid not in self.cmd:
                self.cmd[pid] = _cmdline(pid)
            self.cpu[pid] = max(seconds, self.cpu.get(pid, 0.0))
            todo.extend(_children(pid))

    def _run(self):
        while not self._stop.wait(self._interval):
            self.sample()

    def __enter__(self):
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.sample()


def _is_worker(cmd):
    # multi_processing starts each worker through a shell, which is not counted.
    return ("sdk_worker" in cmd or "SdkHarness" in cmd) and not cmd.startswith(("/bin/sh", "sh "))


def _spin(n):
    total = 0
    for i in range(n):
        total += i
    return total


def cores_available(workers, n=20_000_000):
    """Wall of one process spinning over wall of ``workers`` processes doing as much each, times
    ``workers``: the cores that a perfectly parallel job gets on this machine right now."""
    import multiprocessing

    def run(k):
        start = time.perf_counter()
        procs = [multiprocessing.Process(target=_spin, args=(n,)) for _ in range(k)]
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join()
        return time.perf_counter() - start

    return workers * run(1) / run(workers)


# ---- the portable services ------------------------------------------------------------------

def serve_jobs(port):
    """Beam's local job service, whose jobs run ``--direct_num_workers`` SDK workers."""
    from apache_beam.portability.api import beam_job_api_pb2
    from apache_beam.runners.portability import local_job_service
    from apache_beam.runners.portability.fn_api_runner import fn_runner

    class ParallelBeamJob(local_job_service.BeamJob):
        def _invoke_runner(self):
            # The stock job runs FnApiRunner.run_via_runner_api, which leaves the
            # runner at its default of one worker; run_pipeline would read the
            # option but needs a Pipeline object, not the submitted proto.
            self.set_state(beam_job_api_pb2.JobState.RUNNING)
            options = self.pipeline_options()
            workers = int(options.view_as(DirectOptions).direct_num_workers or 0)
            runner = fn_runner.FnApiRunner(provision_info=self._provision_info)
            runner._num_workers = workers if workers > 0 else os.cpu_count()
            return runner.run_via_runner_api(self._pipeline_proto, options)

    servicer = local_job_service.LocalJobServicer(beam_job_type=ParallelBeamJob)
    print("job service listening on port", servicer.start_grpc_server(port), flush=True)
    try:
        while True:
            time.sleep(3600)
    finally:
        servicer.stop()


def service_env():
    # The worker pool starts SDK workers with the first `python` on PATH (venv_env puts
    # this interpreter's first), and the workers import scale (this pipeline's functions).
    return venv_env(PYTHONPATH=os.pathsep.join(
        p for p in (HERE, ROOT, os.environ.get("PYTHONPATH")) if p))


@contextlib.contextmanager
def portable_services(stock, log_dir):
    """(job endpoint, worker pool endpoint, job service pid) of services that live for the block."""
    job_port, pool_port = free_port(), free_port()
    if stock:
        job = [sys.executable, "-m", "apache_beam.runners.portability.local_job_service_main",
               f"--port={job_port}"]
    else:
        job = [sys.executable, os.path.abspath(__file__), "--serve-jobs", str(job_port)]
    pool = [sys.executable, "-m", "apache_beam.runners.worker.worker_pool_main",
            f"--service_port={pool_port}"]
    suffix = "-stock" if stock else ""
    with server(job, job_port, os.path.join(log_dir, f"job_service{suffix}.log"), timeout=60.0,
                env=service_env()) as job_proc, \
            server(pool, pool_port, os.path.join(log_dir, f"worker_pool{suffix}.log"),
                   timeout=60.0, env=service_env()):
        yield f"localhost:{job_port}", f"localhost:{pool_port}", job_proc.pid


def options_for(mode, workers, endpoints=None):
    if mode == "multi_processing":
        return PipelineOptions(flags=["--direct_num_workers", str(workers),
                                      "--direct_running_mode", mode], runner="FnApiRunner")
    job, pool, _ = endpoints
    flags = ["--direct_num_workers", str(workers)]
    if mode == "portable-stock":
        flags += ["--sdk_worker_parallelism", str(workers)]
    return PipelineOptions(flags=flags, runner="PortableRunner", job_endpoint=job,
                           environment_type="EXTERNAL", environment_config=pool)


def measure(mode, workers, keys, steps, events, endpoints, sink, source):
    """One run: wall s, CPU s of this process and of the job service (None for
    multi_processing), [CPU s of each SDK worker], releases, {pid: releases}."""
    sampler = CpuSampler()
    sampler.sample()
    before = {pid: s for pid, s in sampler.cpu.items()}
    own = time.process_time()
    with sampler:
        wall = run_release(keys, steps, events, options_for(mode, workers, endpoints), sink,
                           source)
        time.sleep(0.3)         # let the last worker report and exit
    own = time.process_time() - own
    job_cpu = None
    if endpoints is not None:
        job_cpu = sampler.cpu[endpoints[2]] - before.get(endpoints[2], 0.0)
    # Only workers started by this run: the pool's workers of earlier runs linger.
    worker_cpu = sorted((s for pid, s in sampler.cpu.items()
                         if pid not in before and _is_worker(sampler.cmd[pid])), reverse=True)
    lines, per_pid = read_releases(sink)
    return wall, own, job_cpu, worker_cpu, lines, per_pid


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=72)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--modes", default="multi_processing,portable")
    parser.add_argument("--inputs", default="create", help=f"from {', '.join(SOURCES)}")
    parser.add_argument("--serve-jobs", type=int, default=None, metavar="PORT",
                        help="only run the job service (used by the portable mode)")
    args = parser.parse_args(argv)
    if args.serve_jobs is not None:
        return serve_jobs(args.serve_jobs)
    modes = [m for m in args.modes.split(",") if m]
    sources = [s for s in args.inputs.split(",") if s]
    if set(modes) - set(MODES) or set(sources) - set(SOURCES) or args.workers < 2:
        parser.error(f"--modes from {', '.join(MODES)}; --inputs from {', '.join(SOURCES)}; "
                     "--workers >= 2")
    cases = [(m, s) for m in modes for s in sources]
    # multi_processing workers are this process's children: they import scale too.
    os.environ["PYTHONPATH"] = service_env()["PYTHONPATH"]
    events = events_for(args.keys, args.steps)
    counts = (1, args.workers)
    runs = collections.defaultdict(list)
    reference, same = None, True
    print(f"sharded ContinualCount, {args.keys:,} keys x {args.steps} steps, 2 events per key "
          f"and step, {os.cpu_count()} cores; load average at start: "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    # On a shared machine N workers may not get N cores: measured before and after.
    print(f"cores that {args.workers} spinning processes get (before): "
          f"{cores_available(args.workers):.2f}", flush=True)
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        endpoints = {m: stack.enter_context(portable_services(m == "portable-stock", tmp))
                     for m in modes if m != "multi_processing"}
        for r in range(args.repeats):
            for mode, source in cases:     # interleaved: load drifts hit every case alike
                for n in counts:
                    sink = os.path.join(tmp, f"releases-{mode}-{source}-{n}-{r}")
                    wall, own, job, workers, lines, per_pid = measure(
                        mode, n, args.keys, args.steps, events, endpoints.get(mode), sink, source)
                    runs[mode, source, n].append((wall, own, job, workers, per_pid))
                    if reference is None:
                        reference = lines
                    same = same and lines == reference
            print(f"  repeat {r + 1}/{args.repeats} done; load average "
                  f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
        logs = {name: open(os.path.join(tmp, name)).read()
                for name in os.listdir(tmp) if name.endswith(".log")}
    complete = reference is not None and len(reference) == args.keys * args.steps
    print(f"medians of {args.repeats} interleaved runs; CPU s of this process (the pipeline's "
          "construction, and the runner for multi_processing), of the job service (the runner "
          "for portable) and of each SDK worker; released by: pids that released")
    print(f"{'mode':<17} {'input':<6} {'workers':>7} {'wall s':>7} {'speed-up':>8} {'main CPU':>8} "
          f"{'job svc CPU':>11} {'worker CPU (each)':>18} {'cores used':>10} {'released by':>12}")
    for mode, source in cases:
        walls = {n: statistics.median(r[0] for r in runs[mode, source, n]) for n in counts}
        for n in counts:
            rows = runs[mode, source, n]
            own = statistics.median(r[1] for r in rows)
            job = f"{statistics.median(r[2] for r in rows):.1f}" if rows[0][2] is not None else "-"
            width = max(len(r[3]) for r in rows)
            each = [statistics.median(r[3][i] if i < len(r[3]) else 0.0 for r in rows)
                    for i in range(width)]
            released = sorted({len(r[4]) for r in rows})
            # CPU seconds of all processes of the run per wall second: how many cores it got.
            cores = statistics.median((r[1] + (r[2] or 0.0) + sum(r[3])) / r[0] for r in rows)
            speed = f"{walls[1] / walls[n]:.2f}" if n > 1 else ""
            print(f"{mode:<17} {source:<6} {n:>7} {walls[n]:>7.1f} {speed:>8} {own:>8.1f} "
                  f"{job:>11} {' + '.join(f'{c:.1f}' for c in each) or '-':>18} {cores:>10.2f} "
                  f"{'/'.join(map(str, released)) + ' pid(s)':>12}")
    print(f"cores that {args.workers} spinning processes get (after): "
          f"{cores_available(args.workers):.2f}")
    started = {name: text.count("Starting worker with command") for name, text in logs.items()
               if name.startswith("worker_pool")}
    if started:
        print("SDK workers started by the worker pool(s): "
              + ", ".join(f"{name[:-4]} {count}" for name, count in sorted(started.items())))
    print(f"same releases in all {sum(len(v) for v in runs.values())} runs: {same}; "
          f"every key releases every step: {complete}; load average at end: "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)


if __name__ == "__main__":
    main()
