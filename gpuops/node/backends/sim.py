"""The simulated node backend: a node built from a sim spec, with NVML's MIG and error semantics.

Figures are a pure function of (seed, simulated time): the clock is injectable, and noise comes
from hashes of (seed, GPU, workload, time bucket). MIG changes (the only state) are kept in
memory per backend instance and can be exported and imported as JSON-ready dicts.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple, Union

from gpuops.core.model import (
    ComputeInstance,
    Gpu,
    GpuInstance,
    GpuProcess,
    GpuSample,
    MigInstanceSample,
    Node,
    NodeSample,
    NotAvailable,
    PartitionState,
)
from gpuops.node.backends.base import (
    Backend,
    BackendError,
    BackendUnavailable,
    MigModeChange,
    unix_user_id,
    unix_user_name,
)
from gpuops.node.mps import InMemoryMpsControl, MpsControl
from gpuops.node.sim import workloads as wl
from gpuops.node.sim.device import Hardware, SimDevice, device_uuid
from gpuops.node.sim.spec import SimSpec, SpecError, WorkloadSpec, load_spec, resolve_compute_profile

STATE_VERSION = 1
_HISTORY_STEPS = 10  # minutes of load history behind the temperature
_HISTORY_STEP = 60.0
# Weight of the power now (0) and i minutes ago (1..10) in the temperature.
_WEIGHTS = tuple(math.exp(-i / 3.0) for i in range(_HISTORY_STEPS + 1))
_WEIGHT_SUM = sum(_WEIGHTS)
_MINUTES_KEPT = 64  # per GPU, before the minute caches are pruned to the window in use
_NOT_SUPPORTED = NotAvailable("NOT_SUPPORTED")
# The figures of a GpuSample after its timestamp, as `unsupported` names them.
_FIGURES = (
    "utilization_gpu",
    "utilization_memory",
    "memory",
    "memory",
    "power",
    "temperature",
    "sm_clock",
    "memory_clock",
)
_LOST = NotAvailable("GPU_IS_LOST")


class _Workload:
    """A workload's runtime binding; the spec's schedule, changeable by start/stop calls."""

    def __init__(self, spec: WorkloadSpec, model: wl.WorkloadModel, epoch: float) -> None:
        self.spec = spec
        self.model = model
        self.start: Optional[float] = None if spec.start is None else epoch + spec.start
        self.stop: Optional[float] = None if spec.stop is None else epoch + spec.stop
        self.gpus: Tuple[int, ...] = spec.gpus
        self.gpu_instance_id: Optional[int] = None
        self.compute_instance_id: Optional[int] = None
        self.pids: Tuple[int, ...] = ()
        self.footprints: Tuple[int, ...] = ()
        # How fast the workload's own clock runs (warm-up, checkpoints): 1 for the spec's work;
        # a fleet scheduler that runs queued work faster than real time (simfleet/demand.py)
        # speeds it up as much as the work, so a sped-up job looks like its full-speed self.
        self.pace = 1.0

    @property
    def name(self) -> str:
        return self.spec.name


@dataclass(frozen=True)
class _Proc:
    workload: _Workload
    gpu: int
    pid: int
    gpu_instance_id: Optional[int]
    compute_instance_id: Optional[int]
    activity: wl.Activity
    footprint: int


class SimBackend(Backend):
    """A simulated node. `spec` is a path, a built-in scenario name or a dict; `sim_spec` is what
    `gpuops agent --sim-spec FILE` passes; neither: the built-in demo node."""

    name = "sim"

    def __init__(
        self,
        spec: Optional[Union[str, Dict[str, Any]]] = None,
        sim_spec: Optional[str] = None,
        clock: Optional[Callable[[], float]] = None,
        seed: Optional[int] = None,
    ) -> None:
        source = spec if spec is not None else sim_spec
        label = (
            source if isinstance(source, str) else ("<dict>" if source is not None else "builtin:demo-node")
        )
        try:
            self._spec = load_spec(source)
            label = self._spec.source
            if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
                raise SpecError("seed", "expected an integer, got %r" % (seed,))
            self._clock: Callable[[], float] = clock if clock is not None else time.time
            self._seed = seed if seed is not None else self._spec.seed
            self._epoch = self._spec.epoch if self._spec.epoch is not None else float(self._clock())
            self._lock = threading.RLock()
            self._layout_ids: Dict[Tuple[int, int], Tuple[int, Tuple[int, ...]]] = {}
            self._devices = self._build_devices()
            self._workloads = self._build_workloads()
            self._noise_memo: wl.NoiseMemo = {}  # hashed noise by key, last bucket (pure values)
            self._ambient = [25.0 + 3.0 * wl.noise(self._seed, "ambient", d.index) for d in self._devices]
            # Caches of figures that are pure functions of (seed, time) for a given state: the
            # state they were computed under is `_cache_key`; any change empties them.
            self._cache_key: Optional[Tuple[Any, ...]] = None
            self._on_gpu: List[Tuple[Tuple[_Workload, int], ...]] = []
            self._minute_powers: List[Dict[int, float]] = []
            self._minute_sums: List[Dict[int, float]] = []
            self._process_cache: Dict[Tuple[str, int], Tuple[int, GpuProcess]] = {}
            self._refresh()
            self._mps: Optional[InMemoryMpsControl] = None
        except SpecError as exc:
            if not label.isprintable():
                label = repr(label)
            raise BackendUnavailable("sim spec %s: %s" % (label, exc)) from None
        self._closed = False

    # ---- construction ---------------------------------------------------------------------
    def _build_devices(self) -> List[SimDevice]:
        spec = self._spec
        devices = []
        for g in spec.gpus:
            uuid = device_uuid(g.hardware, spec.hostname, self._seed, g.index, g.hardware.key)
            device = SimDevice(
                index=g.index,
                hardware=g.hardware,
                uuid=uuid,
                driver_version=spec.driver_version,
                owner=g.owner,
                mig_enabled=g.mig_enabled,
                mig_pending=g.mig_pending,
                unsupported=g.unsupported,
                compute_mode=g.compute_mode,
                memory_mode=g.memory_mode,
                cuda_version=spec.cuda_driver_version,
            )
            for i, entry in enumerate(g.layout):
                model = g.hardware.mig
                assert model is not None
                try:
                    profile = model.profile(entry.profile)
                    gi = device.create_gpu_instance(profile.id, entry.start)
                    ci_ids = []
                    wanted = entry.compute_instances or (device.default_compute_profile(gi.id),)
                    for j, ci in enumerate(wanted):
                        cp = resolve_compute_profile(profile, ci)
                        if cp is None:  # pragma: no cover - the loader checked it
                            raise SpecError("%s.compute_instances[%d]" % (entry.path, j), "unknown profile")
                        try:
                            ci_ids.append(device.create_compute_instance(gi.id, cp).id)
                        except BackendError as exc:
                            raise SpecError("%s.compute_instances[%d]" % (entry.path, j), str(exc)) from None
                except BackendError as exc:
                    raise SpecError(entry.path, str(exc)) from None
                except (KeyError, ValueError, TypeError) as exc:  # pragma: no cover - checked by the loader
                    raise SpecError(entry.path, "bad profile: %s" % exc) from None
                self._layout_ids[(g.index, i)] = (gi.id, tuple(ci_ids))
            device.lost = g.lost  # a lost GPU keeps the layout it had when it fell off the bus
            devices.append(device)
        return devices

    def _build_workloads(self) -> List[_Workload]:
        out = []
        used_pids: Set[int] = set()
        layout = self._layout_ids
        for spec in self._spec.workloads:
            model = wl.MODELS[spec.kind]
            w = _Workload(spec, model, self._epoch)
            if spec.instance is not None:
                gi_id, ci_ids = layout[(spec.gpus[0], spec.instance)]
                w.gpu_instance_id = gi_id
                w.compute_instance_id = (
                    ci_ids[spec.compute_instance] if spec.compute_instance < len(ci_ids) else None
                )
            w.pids = self._pids_for(spec, len(spec.gpus), used_pids)
            w.footprints = tuple(self._footprint(w, g) for g in spec.gpus)
            out.append(w)
        return out

    def _pids_for(self, spec: WorkloadSpec, count: int, used: Set[int]) -> Tuple[int, ...]:
        pid = 2000 + int(wl.noise(self._seed, self._spec.hostname, "pid", spec.name) * 3000000)
        pids = []
        for _ in range(max(count, 1)):
            while pid in used:
                pid += 7
            used.add(pid)
            pids.append(pid)
            pid += 1
        return tuple(pids)

    def _footprint(self, w: _Workload, gpu: int) -> int:
        device = self._devices[gpu]
        if w.gpu_instance_id is not None:
            total = device.gpu_instance_memory_bytes(w.gpu_instance_id)
        else:
            total = device.hardware.memory_total_bytes
        return w.spec.memory.on(total, w.model.default_memory)

    # ---- the spec and its people -----------------------------------------------------------
    @property
    def spec(self) -> SimSpec:
        return self._spec

    @property
    def seed(self) -> int:
        return self._seed

    @property
    def epoch(self) -> float:
        return self._epoch

    def users(self) -> Dict[str, int]:
        return dict(self._spec.users)

    def tenants(self) -> Dict[str, Tuple[str, ...]]:
        return dict(self._spec.tenants)

    def device(self, gpu: int) -> SimDevice:
        """The simulated device (for tests and the fleet layer); INVALID_ARGUMENT when absent."""
        if isinstance(gpu, bool) or not isinstance(gpu, int) or not 0 <= gpu < len(self._devices):
            raise BackendError("INVALID_ARGUMENT", "no GPU %r on %s" % (gpu, self._spec.hostname))
        return self._devices[gpu]

    # ---- time and workload state -----------------------------------------------------------
    def now(self) -> float:
        return float(self._clock())

    def _lost(self, gpu: int, t: float) -> bool:
        device = self._devices[gpu]
        lost_at = self._spec.gpus[gpu].lost_at
        return device.lost or (lost_at is not None and t >= self._epoch + lost_at)

    def _state(self, w: _Workload, t: float) -> str:
        if w.start is None or t < w.start or not w.gpus:
            return wl.PENDING
        if w.stop is not None and t >= w.stop:
            return wl.DONE
        for g in w.gpus:
            device = self._devices[g]
            if self._lost(g, t):
                return wl.BLOCKED
            if w.gpu_instance_id is None:
                if device.mig_current:
                    return wl.BLOCKED
            elif w.compute_instance_id is None or not device.has_compute_instance(
                w.gpu_instance_id, w.compute_instance_id
            ):
                return wl.BLOCKED
        return wl.RUNNING

    def _processes(self, t: float, gpu: int) -> List[_Proc]:
        """The processes running on a GPU at time t (call `_refresh` first)."""
        procs = []
        utc = self._spec.utc_offset
        for w, i in self._on_gpu[gpu]:
            if self._state(w, t) != wl.RUNNING:
                continue
            assert w.start is not None
            moment = wl.Moment(self._seed, (w.name, gpu), t, (t - w.start) * w.pace, utc, self._noise_memo)
            activity = w.model.activity(moment, w.spec.params)
            procs.append(
                _Proc(w, gpu, w.pids[i], w.gpu_instance_id, w.compute_instance_id, activity, w.footprints[i])
            )
        return procs

    def _refresh(self) -> None:
        """Empty the caches when the state they were computed under has changed: a workload's
        binding or schedule, a GPU's MIG state or loss, the epoch (`lost_at` counts from it)."""
        key = (
            self._epoch,
            tuple(d.version for d in self._devices),
            tuple(
                (w.start, w.stop, w.gpus, w.gpu_instance_id, w.compute_instance_id, w.pids, w.footprints)
                for w in self._workloads
            ),
        )
        if key == self._cache_key:
            return
        self._cache_key = key
        on_gpu: List[List[Tuple[_Workload, int]]] = [[] for _ in self._devices]
        for w in self._workloads:
            for i, g in enumerate(w.gpus):
                if 0 <= g < len(on_gpu):
                    on_gpu[g].append((w, i))
        self._on_gpu = [tuple(ws) for ws in on_gpu]
        self._minute_powers = [{} for _ in self._devices]
        self._minute_sums = [{} for _ in self._devices]
        self._process_cache.clear()

    def _busy(self, gpu: int, gi: Optional[int] = None, ci: Optional[int] = None) -> bool:
        self._refresh()
        for p in self._processes(self.now(), gpu):
            if gi is not None and p.gpu_instance_id != gi:
                continue
            if ci is not None and p.compute_instance_id != ci:
                continue
            return True
        return False

    def workloads(self, at: Optional[float] = None) -> Tuple[wl.WorkloadStatus, ...]:
        """Every workload of the spec with its state now (or at `at`): pending, running, done, blocked."""
        with self._lock:
            t = self.now() if at is None else float(at)
            return tuple(
                wl.WorkloadStatus(
                    name=w.name,
                    kind=w.spec.kind,
                    state=self._state(w, t),
                    tenant=w.spec.tenant,
                    user=w.spec.user,
                    command=w.spec.command,
                    gpus=w.gpus,
                    gpu_instance_id=w.gpu_instance_id,
                    compute_instance_id=w.compute_instance_id,
                    start=w.start,
                    stop=w.stop,
                    pids=w.pids[: len(w.gpus)],
                    memory_bytes=w.footprints,
                )
                for w in self._workloads
            )

    def _workload(self, name: str) -> _Workload:
        for w in self._workloads:
            if w.name == name:
                return w
        raise BackendError("NOT_FOUND", "no workload %r on %s" % (name, self._spec.hostname))

    def start_workload(
        self,
        name: str,
        gpus: Optional[Sequence[int]] = None,
        gpu_instance_id: Optional[int] = None,
        compute_instance_id: Optional[int] = None,
        at: Optional[float] = None,
    ) -> wl.WorkloadStatus:
        """Start a (queued) workload now or at `at`, optionally on other GPUs or a MIG instance
        (by GPU-instance and compute-instance id). The pool layer places queued work with this."""
        with self._lock:
            w = self._workload(name)
            t = self.now() if at is None else float(at)
            if not math.isfinite(t):
                raise BackendError("INVALID_ARGUMENT", "start time must be finite")
            if compute_instance_id is not None and gpu_instance_id is None:
                raise BackendError("INVALID_ARGUMENT", "a compute instance needs its GPU instance")
            if gpus is not None:
                targets = tuple(gpus)
                if not targets or len(set(targets)) != len(targets):
                    raise BackendError("INVALID_ARGUMENT", "gpus must be distinct and not empty")
                for g in targets:
                    self.device(g)
                if gpu_instance_id is not None and len(targets) != 1:
                    raise BackendError("INVALID_ARGUMENT", "a MIG instance target needs exactly one GPU")
                w.gpus = targets
                w.gpu_instance_id = gpu_instance_id
                w.compute_instance_id = (
                    None
                    if gpu_instance_id is None
                    else (compute_instance_id if compute_instance_id is not None else 0)
                )
                w.pids = self._pids_for(w.spec, len(targets), self._pids_in_use(w))
                w.footprints = tuple(self._footprint(w, g) for g in targets)
            elif not w.gpus:
                raise BackendError("INVALID_ARGUMENT", "workload %r has no target: give gpus" % name)
            duration = w.spec.duration
            if duration is None and w.spec.start is not None and w.spec.stop is not None:
                duration = w.spec.stop - w.spec.start
            w.start = t
            w.stop = t + duration if duration is not None else None
            return next(s for s in self.workloads(at=t) if s.name == name)

    def remove_workload(self, name: str) -> WorkloadSpec:
        """Take a workload off this node and return its spec: queued work that a fleet scheduler
        runs on another node (`adopt_workload` there), or finished work it has accounted for."""
        with self._lock:
            w = self._workload(name)
            self._workloads.remove(w)
            return w.spec

    def adopt_workload(
        self, spec: WorkloadSpec, gpu: int, duration: float, pace: float = 1.0, at: Optional[float] = None
    ) -> wl.WorkloadStatus:
        """Run a workload queued elsewhere on one whole GPU of this node, from now (or `at`) for
        `duration` seconds, its own clock running `pace` times real time. Its name must be free
        here; its memory footprint is measured against this node's GPU."""
        with self._lock:
            self.device(gpu)
            if any(w.name == spec.name for w in self._workloads):
                where = self._spec.hostname
                raise BackendError("ALREADY_EXISTS", "workload %r already on %s" % (spec.name, where))
            if not (math.isfinite(duration) and duration > 0 and math.isfinite(pace) and pace > 0):
                raise BackendError("INVALID_ARGUMENT", "duration and pace must be positive and finite")
            t = self.now() if at is None else float(at)
            w = _Workload(spec, wl.MODELS[spec.kind], self._epoch)
            w.gpus = (gpu,)
            w.pace = pace
            w.pids = self._pids_for(spec, 1, self._pids_in_use(w))
            w.footprints = (self._footprint(w, gpu),)
            w.start = t
            w.stop = t + duration
            self._workloads.append(w)
            return next(s for s in self.workloads(at=t) if s.name == spec.name)

    def occupancy(self, gpu: int) -> Tuple[float, int, int]:
        """(utilization %, bytes running processes ask for, each its CUDA context at least, bytes
        the driver leaves of the GPU) of a whole GPU now: what a batch scheduler looks at before
        it places a job there."""
        with self._lock:
            device = self.device(gpu)
            self._refresh()
            procs = self._processes(self.now(), gpu)
            util = sum(p.activity.utilization_percent for p in procs)
            if device.mig_current:
                util = sum(
                    p.activity.utilization_percent
                    * device.gpu_instance_compute_share(p.gpu_instance_id or 0, p.compute_instance_id)
                    for p in procs
                )
            held = sum(max(p.footprint, device.context_bytes) for p in procs)
            return min(util, 100.0), held, device.usable_bytes

    def _pids_in_use(self, skip: _Workload) -> Set[int]:
        return {pid for w in self._workloads if w is not skip for pid in w.pids}

    def stop_workload(self, name: str, at: Optional[float] = None) -> None:
        """End a workload now (or at `at`), like killing its processes."""
        with self._lock:
            w = self._workload(name)
            t = self.now() if at is None else float(at)
            w.stop = t
            if w.start is not None and w.start >= t:
                w.start = None

    def stop_processes(self, gpu: int, pids: Sequence[int], grace: float = 10.0) -> List[int]:
        """Simulated processes end at once with their workload (what `apply --force` does)."""
        wanted = set(pids)
        with self._lock:
            names = [w.name for w in self._workloads if gpu in w.gpus and wanted & set(w.pids)]
        for name in names:
            self.stop_workload(name)
        return []

    # ---- Backend: MPS and users -------------------------------------------------------------
    def mps_control(self) -> MpsControl:
        """MPS daemons of this simulated node, in memory (kept as long as the backend). The
        processes that start on a device while its daemon runs are its clients."""
        with self._lock:
            if self._mps is None:
                self._mps = InMemoryMpsControl(self._mps_clients)
            return self._mps

    def _mps_clients(self, device_uuid: str) -> List[Tuple[int, int]]:
        """(pid, uid) of the processes running on a GPU or MIG device now."""
        with self._lock:
            self._check_open()
            t = self.now()
            self._refresh()
            for d in self._devices:
                if self._lost(d.index, t):
                    continue
                if d.uuid == device_uuid:
                    if d.mig_current:
                        return []
                    return [(p.pid, self._uid(p.workload.spec.user)) for p in self._processes(t, d.index)]
                if not d.mig_current:
                    continue
                for gi in d.gpu_instances():
                    for ci in gi.compute_instances:
                        if ci.uuid == device_uuid:
                            return [
                                (p.pid, self._uid(p.workload.spec.user))
                                for p in self._processes(t, d.index)
                                if p.gpu_instance_id == gi.id and p.compute_instance_id == ci.id
                            ]
            return []

    def _uid(self, user: str) -> int:
        uid = self.user_id(user) if user else None
        if uid is None:  # a simulated user nobody declared: a stable uid of its own
            uid = 60000 + int(wl.noise(self._seed, "uid", user) * 5000)
        return uid

    def user_id(self, name: str) -> Optional[int]:
        """The spec's users first, then the machine's."""
        uid = self._spec.users.get(name)
        return uid if uid is not None else unix_user_id(name)

    def user_name(self, uid: int) -> str:
        for name, value in self._spec.users.items():
            if value == uid:
                return name
        return unix_user_name(uid)

    # ---- Backend: inventory and samples ----------------------------------------------------
    def capabilities(self) -> Tuple[str, ...]:
        return ("inventory", "sample", "mig-control", "gpu-reset", "workloads", "partition-control")

    def close(self) -> None:
        self._closed = True

    def _check_open(self) -> None:
        if self._closed:
            raise BackendError("UNINITIALIZED", "the simulator was closed")

    def inventory(self) -> Node:
        with self._lock:
            self._check_open()
            t = self.now()
            gpus = []
            for d in self._devices:
                lost = self._lost(d.index, t)
                gpus.append(
                    Gpu(
                        info=d.info(lost),
                        mig=None if lost else d.mig_state(),
                        owner=d.owner,
                        partition=d.partition_state() if d.partitioned else None,
                    )
                )
            return Node(
                hostname=self._spec.hostname,
                backend=self.name,
                driver_version=self._spec.driver_version,
                cuda_driver_version=self._spec.cuda_driver_version,
                gpus=tuple(gpus),
            )

    def sample(self) -> NodeSample:
        with self._lock:
            self._check_open()
            t = self.now()
            self._refresh()
            return NodeSample(
                hostname=self._spec.hostname,
                timestamp=t,
                gpus=tuple(self._sample_gpu(d, t) for d in self._devices),
            )

    def _load(self, device: SimDevice, procs: Sequence[_Proc]) -> Tuple[float, float, bool]:
        """(SM load 0-1, memory-bandwidth load 0-1, anything holding memory) of a whole GPU."""
        if device.mig_current:
            sm = sum(
                p.activity.utilization_percent
                / 100.0
                * device.gpu_instance_compute_share(p.gpu_instance_id or 0, p.compute_instance_id)
                for p in procs
            )
            mem = sum(
                p.activity.memory_utilization_percent
                / 100.0
                * device.gpu_instance_compute_share(p.gpu_instance_id or 0)
                for p in procs
            )
        else:
            sm = sum(p.activity.utilization_percent for p in procs) / 100.0
            mem = sum(p.activity.memory_utilization_percent for p in procs) / 100.0
        return min(sm, 1.0), min(mem, 1.0), bool(procs)

    @staticmethod
    def _instance_utilization(device: SimDevice, gi_id: int, procs: Sequence[_Proc]) -> Any:
        """A GPU instance's SM utilization as NVML's GPM reports it: from Hopper on (Ampere's
        NVML says NOT_SUPPORTED), its processes' activity weighted by their compute instance's
        share of the GPU instance."""
        if device.hardware.architecture == "ampere" or "utilization_gpu" in device.unsupported:
            return _NOT_SUPPORTED
        whole = device.gpu_instance_compute_share(gi_id)
        if whole <= 0:
            return 0.0
        busy = sum(
            p.activity.utilization_percent * device.gpu_instance_compute_share(gi_id, p.compute_instance_id)
            for p in procs
            if (p.gpu_instance_id or 0) == gi_id
        )
        return round(min(busy / whole, 100.0), 1)

    def _sample_gpu(self, device: SimDevice, t: float) -> Gpu:
        index = device.index
        if self._lost(index, t):
            sample = GpuSample(t, _LOST, _LOST, _LOST, _LOST, _LOST, _LOST, _LOST, _LOST)
            return Gpu(info=device.info(True), mig=None, sample=sample, owner=device.owner)
        hw = device.hardware
        past = self._past_power(device, t)  # first: it hashes other noise buckets than now's
        procs = self._processes(t, index)
        memory = self._allocate(device, procs)
        processes = tuple(self._process(device, p, memory[i]) for i, p in enumerate(procs))
        sm, mem, holding = self._load(device, procs)
        power = self._power(device, t, sm, holding)
        temperature = self._temperature(device, t, power, past)
        unsupported = device.unsupported
        used = sum(memory)
        mig_samples: Tuple[MigInstanceSample, ...] = ()
        mig_on = device.mig_current
        if mig_on:
            per_gi: Dict[int, int] = {}
            for i, p in enumerate(procs):
                per_gi[p.gpu_instance_id or 0] = per_gi.get(p.gpu_instance_id or 0, 0) + memory[i]
            mig_samples = tuple(
                MigInstanceSample(
                    gpu_instance_id=gi.id,
                    memory_used_bytes=_NOT_SUPPORTED if "memory" in unsupported else per_gi.get(gi.id, 0),
                    memory_total_bytes=_NOT_SUPPORTED if "memory" in unsupported else gi.memory_total_bytes,
                    sm_utilization_percent=self._instance_utilization(device, gi.id, procs),
                )
                for gi in device.gpu_instances()
            )
        figures: List[Any] = [
            _NOT_SUPPORTED if mig_on else round(sm * 100.0, 1),
            _NOT_SUPPORTED if mig_on else round(mem * 100.0, 1),
            used,
            hw.memory_total_bytes,
            round(power, 2),
            float(round(temperature)),
            self._sm_clock(hw, sm, temperature),
            hw.memory_clock_mhz if holding else hw.idle_memory_clock_mhz,
        ]
        if unsupported:
            for i, name in enumerate(_FIGURES):
                if name in unsupported:
                    figures[i] = _NOT_SUPPORTED
        return Gpu(
            info=device.info(),
            mig=device.mig_state(),
            sample=GpuSample(t, *figures),
            mig_samples=mig_samples,
            processes=processes,
            owner=device.owner,
            partition=device.partition_state() if device.partitioned else None,
        )

    def _allocate(self, device: SimDevice, procs: Sequence[_Proc]) -> List[int]:
        """Memory each process holds, earliest first; a target never holds more than it has. A
        process holds at least its CUDA context (a workload's `memory` is its whole footprint,
        as NVML counts it: its context included), and processes of a whole GPU share what its
        driver leaves of it (the reserve is nobody's)."""
        context = device.context_bytes
        free: Dict[Optional[int], int] = {}
        out = [0] * len(procs)
        order = sorted(
            range(len(procs)), key=lambda i: (procs[i].workload.start or 0.0, procs[i].workload.name)
        )
        for i in order:
            p = procs[i]
            key = p.gpu_instance_id if device.mig_current else None
            if key not in free:
                free[key] = device.gpu_instance_memory_bytes(key) if key is not None else device.usable_bytes
            want = int(p.footprint * wl.clamp(p.activity.memory_fraction, 0.0, 1.0))
            want -= want % (1024 * 1024)  # the driver hands out whole MiB
            want = max(want, context)
            got = min(want, free[key])
            free[key] -= got
            out[i] = got
        return out

    def _process(self, device: SimDevice, p: _Proc, memory: int) -> GpuProcess:
        # The same (frozen) object while the memory it holds does not change; the cache is
        # emptied with any change of the state the other fields come from.
        w = p.workload
        slot = (w.name, p.gpu)
        hit = self._process_cache.get(slot)
        if hit is not None and hit[0] == memory:
            return hit[1]
        on_mig = device.mig_current and p.gpu_instance_id is not None
        process = GpuProcess(
            pid=p.pid,
            used_memory_bytes=_NOT_SUPPORTED if "process_memory" in device.unsupported else memory,
            user=w.spec.user,
            command=w.spec.command,
            gpu_instance_id=p.gpu_instance_id if on_mig else None,
            compute_instance_id=p.compute_instance_id if on_mig else None,
            tenant=w.spec.tenant if w.spec.limiter else None,
            tenant_source="limiter" if w.spec.limiter and w.spec.tenant else "",
            groups=w.spec.groups,
        )
        self._process_cache[slot] = (memory, process)
        return process

    def _power(self, device: SimDevice, t: float, load: float, holding: bool) -> float:
        hw = device.hardware
        span = hw.power_limit_watts - hw.idle_watts
        wobble = wl.smooth_noise(self._seed, ("power", device.index), t, 4.0, self._noise_memo)
        watts = hw.idle_watts * (0.97 + 0.06 * wobble)
        if load > 0:
            watts += span * (load**0.85) * (0.9 + 0.1 * wobble)
        if holding:
            watts += 0.03 * span  # a context keeps the GPU out of its deepest idle state
        return min(watts, hw.power_limit_watts)

    def _minute_power(self, device: SimDevice, minute: int) -> float:
        """Power at the start of a whole minute (the pure figure, cached per GPU)."""
        powers = self._minute_powers[device.index]
        watts = powers.get(minute)
        if watts is None:
            at = minute * _HISTORY_STEP
            sm, _mem, holding = self._load(device, self._processes(at, device.index))
            watts = powers[minute] = self._power(device, at, sm, holding)
        return watts

    def _minute_sum(self, device: SimDevice, minute: int) -> float:
        """Sum over s = 1..10 of weight(s) x power at whole minute `minute - s + 1`: the past
        terms of the temperature at the end of that minute."""
        sums = self._minute_sums[device.index]
        total = sums.get(minute)
        if total is None:
            total = 0.0
            for step in range(1, _HISTORY_STEPS + 1):
                total += _WEIGHTS[step] * self._minute_power(device, minute - step + 1)
            sums[minute] = total
        return total

    def _past_power(self, device: SimDevice, t: float) -> float:
        """The temperature's past terms: sum over s = 1..10 of weight(s) x power s minutes ago,
        each past power interpolated between the whole minutes around it. So the terms move
        smoothly with t, and one sample costs two cached sums: the history is computed once per
        whole minute and GPU, as a pure function of (seed, time), whatever order samples come in."""
        x = t / _HISTORY_STEP
        minute = math.floor(x)
        before = self._minute_sum(device, minute - 1)
        after = self._minute_sum(device, minute)
        index = device.index
        for cache, low in (
            (self._minute_powers[index], minute - _HISTORY_STEPS),
            (self._minute_sums[index], minute - 1),
        ):
            if len(cache) > _MINUTES_KEPT:
                for key in [k for k in cache if not low <= k <= minute]:
                    del cache[key]
        return before + (after - before) * (x - minute)

    def _temperature(self, device: SimDevice, t: float, power: float, past: float) -> float:
        """Die temperature follows power with a lag of a few minutes (a weighted past)."""
        avg = (_WEIGHTS[0] * power + past) / _WEIGHT_SUM
        jitter = wl.smooth_noise(self._seed, ("temp", device.index), t, 30.0, self._noise_memo) - 0.5
        return self._ambient[device.index] + 48.0 * avg / device.hardware.power_limit_watts + jitter

    @staticmethod
    def _sm_clock(hw: Hardware, load: float, temperature: float) -> int:
        if load <= 0.0:
            return hw.idle_sm_clock_mhz
        clock = hw.idle_sm_clock_mhz + (hw.max_sm_clock_mhz - hw.idle_sm_clock_mhz) * min(1.0, load * 4.0)
        if temperature > 80.0:
            clock -= (temperature - 80.0) * 15.0
        clock = max(float(hw.idle_sm_clock_mhz), min(float(hw.max_sm_clock_mhz), clock))
        return int(clock // 15 * 15)

    # ---- Backend: MIG control ---------------------------------------------------------------
    def _mig_device(self, gpu: int) -> SimDevice:
        self._check_open()
        device = self.device(gpu)
        if self._lost(gpu, self.now()):
            raise BackendError("GPU_IS_LOST", "GPU %d has fallen off the bus" % gpu)
        return device

    def set_mig_mode(self, gpu: int, enabled: bool) -> MigModeChange:
        with self._lock:
            device = self._mig_device(gpu)
            return device.set_mig_mode(enabled, busy=self._busy(gpu))

    def reset_gpu(self, gpu: int) -> None:
        with self._lock:
            device = self._mig_device(gpu)
            device.reset(busy=self._busy(gpu))

    def create_gpu_instance(self, gpu: int, profile_id: int, start: Optional[int] = None) -> GpuInstance:
        with self._lock:
            return self._mig_device(gpu).create_gpu_instance(profile_id, start)

    def destroy_gpu_instance(self, gpu: int, gpu_instance_id: int) -> None:
        with self._lock:
            device = self._mig_device(gpu)
            device.destroy_gpu_instance(gpu_instance_id, busy=self._busy(gpu, gi=gpu_instance_id))

    def create_compute_instance(
        self, gpu: int, gpu_instance_id: int, profile_id: int, start: Optional[int] = None
    ) -> ComputeInstance:
        with self._lock:
            return self._mig_device(gpu).create_compute_instance(gpu_instance_id, profile_id, start)

    def destroy_compute_instance(self, gpu: int, gpu_instance_id: int, compute_instance_id: int) -> None:
        with self._lock:
            device = self._mig_device(gpu)
            device.destroy_compute_instance(
                gpu_instance_id,
                compute_instance_id,
                busy=self._busy(gpu, gi=gpu_instance_id, ci=compute_instance_id),
            )

    # ---- Backend: partition modes (AMD) -------------------------------------------------------
    def set_partition(
        self, gpu: int, compute_mode: Optional[str] = None, memory_mode: Optional[str] = None
    ) -> PartitionState:
        with self._lock:
            device = self._mig_device(gpu)
            return device.set_partition(compute_mode, memory_mode, busy=self._busy(gpu))

    # ---- state export / import --------------------------------------------------------------
    def export_state(self) -> Dict[str, Any]:
        """MIG state of every GPU and each workload's binding, as JSON-ready data."""
        with self._lock:
            return {
                "version": STATE_VERSION,
                "hostname": self._spec.hostname,
                "seed": self._seed,
                "epoch": self._epoch,
                "devices": [d.export_state() for d in self._devices],
                "workloads": {
                    w.name: {
                        "start": w.start,
                        "stop": w.stop,
                        "gpus": list(w.gpus),
                        "gpu_instance_id": w.gpu_instance_id,
                        "compute_instance_id": w.compute_instance_id,
                        "pids": list(w.pids),
                    }
                    for w in self._workloads
                },
            }

    def import_state(self, data: Mapping[str, Any]) -> None:
        """Restore what `export_state` wrote (same spec); ValueError if it does not fit, and
        then nothing changes."""
        with self._lock:
            if not isinstance(data, Mapping) or data.get("version") != STATE_VERSION:
                raise ValueError("state: expected a version %d state object" % STATE_VERSION)
            if data.get("hostname") != self._spec.hostname:
                raise ValueError(
                    "state: it belongs to host %r, not %r" % (data.get("hostname"), self._spec.hostname)
                )
            devices = data.get("devices")
            if not isinstance(devices, list) or len(devices) != len(self._devices):
                raise ValueError("state: expected %d devices" % len(self._devices))
            saved = [d.export_state() for d in self._devices]
            try:
                for device, item in zip(self._devices, devices):
                    if not isinstance(item, Mapping):
                        raise ValueError("state: device entries must be objects")
                    device.import_state(item)
                bindings = self._parse_bindings(data.get("workloads", {}))
            except ValueError:
                for device, item in zip(self._devices, saved):
                    device.import_state(item)
                raise
            for w in self._workloads:
                if w.name in bindings:
                    w.start, w.stop, w.gpus, w.gpu_instance_id, w.compute_instance_id, w.pids = bindings[
                        w.name
                    ]
                    w.footprints = tuple(self._footprint(w, g) for g in w.gpus)
            epoch = data.get("epoch")
            if isinstance(epoch, (int, float)) and not isinstance(epoch, bool) and math.isfinite(epoch):
                self._epoch = float(epoch)

    def _parse_bindings(self, value: Any) -> Dict[str, Tuple[Any, ...]]:
        if not isinstance(value, Mapping):
            raise ValueError("state: workloads must be an object")
        known = {w.name for w in self._workloads}
        out: Dict[str, Tuple[Any, ...]] = {}

        def opt_number(v: Any, what: str) -> Optional[float]:
            if v is None:
                return None
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ValueError("state: %s must be a number or null" % what)
            return float(v)

        def opt_int(v: Any, what: str) -> Optional[int]:
            if v is None:
                return None
            if isinstance(v, bool) or not isinstance(v, int):
                raise ValueError("state: %s must be an integer or null" % what)
            return v

        for name, item in value.items():
            if name not in known or not isinstance(item, Mapping):
                raise ValueError("state: unknown workload %r" % (name,))
            gpus = item.get("gpus", [])
            pids = item.get("pids", [])
            if not isinstance(gpus, list) or not all(
                isinstance(g, int) and not isinstance(g, bool) and 0 <= g < len(self._devices) for g in gpus
            ):
                raise ValueError("state: workload %r: bad gpus" % name)
            if (
                not isinstance(pids, list)
                or len(pids) < len(gpus)
                or not all(isinstance(p, int) and not isinstance(p, bool) and p > 0 for p in pids)
            ):
                raise ValueError("state: workload %r: bad pids" % name)
            out[name] = (
                opt_number(item.get("start"), "start"),
                opt_number(item.get("stop"), "stop"),
                tuple(gpus),
                opt_int(item.get("gpu_instance_id"), "gpu_instance_id"),
                opt_int(item.get("compute_instance_id"), "compute_instance_id"),
                tuple(pids),
            )
        return out
