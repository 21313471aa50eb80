"""Rollouts on a Ray cluster: the same conductor, in Ray actors, fed by step.

``RayRollouts`` is the ``Rollouts`` of ``[cluster] backend = "ray"``. Each of
``rollout_workers`` :class:`RolloutWorker` actors (``cpus_per_worker`` Ray CPUs each) runs a
trio conductor over its share of a step's episodes, batching at quiescence inside the worker as
the local path does, and streams each episode back as it finishes (a Ray streaming generator);
the training process saves it in the run directory and buffers it for its step, exactly as
``LocalRollouts`` does.

Same science, any placement: a step's episodes are dealt to workers round-robin, but an episode
is a function of its config (seeds from the run's seed, group and member) and the weights of the
policy version it is pinned to, which the worker pulls by version from Ray's object store (put
there once per version by the training process), so which worker ran it, and when it finished,
changes nothing; the learner consumes whole steps in group order, as locally.

An SGLang fleet (``hf_server = "sglang:URL,..."``): the workers hold no model; each is a client
of the fleet over HTTP (``policy.sglang.client``), a *follower*: it samples a share only with
the weight version the share was dealt at (checked in ``/model_info`` before its first batch
and in every answer's ``weight_version``; another version's answer is waited out and sent
again). The training process holds the learner's client: it keeps each new version (written to
disk, or a frozen copy in memory when the fleet takes weights without the disk:
``weights=tensor``, ``distributed`` or ``auto``) and loads it on every server (pause, the load,
weight_version checked, continue), but only once every episode dealt at the version the fleet
holds has come back, then deals the steps the new version allows. So each episode is sampled by
one version, ``step - lag``, as pinned backends are, and the run is reproducible at any ``lag``
(the local path updates the fleet under running episodes when ``lag > 0``; at ``lag = 0`` the
two are the same run).

Faults: a worker that dies (``ray.kill``, SIGKILL, its node lost) is replaced by a fresh actor,
and the episodes of its shares that had not finished run again from their seeds there (the
finished ones are already saved): every episode is used once. A worker that dies twice in a row
without finishing an episode stops the run with an error rather than loop. Ctrl-C cancels the
trio run; leaving ``running`` kills the workers (and stops a Ray this run started).

Ray is an optional extra (``pip install 'collective[ray]'``) imported only here, and only when
a run asks for it.
"""

from __future__ import annotations

import contextlib
import os
import queue
import socket
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from collective.base.log import get_logger
from collective.records import Episode, EpisodeConfig, decode_episode, episode_file_bytes
from collective.rl.backend import Backend, HFBackend, VersionedPolicy, Weights, make_backend
from collective.rl.config import ClusterConfig, TrainConfig
from collective.rl.rollouts import RolloutArgs, Rollouts, first_configs, team_config
from policy.base import Policy, TrainableModel

log = get_logger("collective.rl.cluster")

Share = list[tuple[int, int, EpisodeConfig]]  # (group, member, config) of one worker's share
# An SGLang fleet as a worker sees it: its client's arguments, the version to follow, its label.
Fleet = tuple[dict[str, Any], int, str | None]


def uses_fleet(cfg: TrainConfig) -> bool:
    """Rollouts are sampled by an SGLang fleet (``hf_server = "sglang:..."``)."""
    return cfg.model.kind == "hf" and bool(cfg.hf.server)


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ValueError(
            "cluster.backend = 'ray' needs Ray: pip install 'collective[ray]'"
        ) from None
    return ray


def connect(cluster: ClusterConfig) -> bool:
    """Join the cluster at ``cluster.address``, or start a local Ray (``""``: this machine's
    CPUs, as Ray counts them, and no dashboard); True if this call started Ray (the caller then
    shuts it down). An address that does not answer is one line of error, not a hang."""
    ray = import_ray()
    if ray.is_initialized():
        return False
    kw: dict[str, Any] = dict(include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    if cluster.address:
        _check_reachable(cluster.address)  # ray.init retries an address that is not there for ever
    try:
        if cluster.address:
            ray.init(address=cluster.address, **kw)
        else:
            ray.init(**kw)
    except (ConnectionError, TimeoutError, RuntimeError, ValueError) as e:
        where = cluster.address or "a local Ray"
        raise ValueError(
            f"cluster.address {where!r}: cannot connect to Ray ({_one_line(e)})"
        ) from None
    return not cluster.address


def _check_reachable(address: str) -> None:
    if address == "auto":  # Ray finds the cluster this node belongs to, or says there is none
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(
            f"cluster.address {address!r}: expected '' (a local Ray), 'auto', 'HOST:PORT' or "
            "'ray://HOST:PORT'"
        )
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=10).close()
    except OSError as e:
        raise ValueError(
            f"cluster.address {address!r}: no Ray answers there ({e.strerror or e}); start one "
            "with `ray start --head` or fix the address"
        ) from None


def check_resources(cluster: ClusterConfig, learner_cpus: float = 0.0) -> None:
    """The cluster must hold the workers (and the learner's GPUs) it is asked for: Ray would
    otherwise leave them pending forever."""
    ray = import_ray()
    have = ray.cluster_resources()
    if cluster.learner_gpus > have.get("GPU", 0.0) + 1e-9:
        raise ValueError(
            f"cluster.learner_gpus = {cluster.learner_gpus:g}, but the Ray cluster has "
            f"{have.get('GPU', 0.0):g} GPUs"
        )
    want_cpus = cluster.rollout_workers * cluster.cpus_per_worker + learner_cpus
    if want_cpus > have.get("CPU", 0.0) + 1e-9:
        learner = f" and the learner's {learner_cpus:g}" if learner_cpus else ""
        raise ValueError(
            f"cluster: {cluster.rollout_workers} rollout_workers x cpus_per_worker "
            f"{cluster.cpus_per_worker:g}{learner} need {want_cpus:g} CPUs, but the Ray cluster "
            f"has {have.get('CPU', 0.0):g}"
        )


def _one_line(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return f"{type(e).__name__}: {(lines or [''])[0][:300]}"


class RolloutWorker:
    """A Ray actor: one trio conductor over the episodes it is sent, the policy a copy of the
    trained model, one per live version, its weights pulled from the object store by version.

    (Decorated with ``ray.remote`` when a run starts, so that importing this module does not
    import Ray.)"""

    def __init__(self, cfg: TrainConfig, concurrency: int) -> None:
        import torch

        torch.set_num_threads(1)  # a worker is a conductor: one core's worth of policy batches
        self.cfg = cfg
        self.concurrency = concurrency
        # The run directory is the training process's; a worker writes nothing there. A worker
        # of an SGLang fleet holds no model (nor needs the learner's device): the fleet samples.
        self.backend: Backend | None = None if uses_fleet(cfg) else make_backend(cfg, _nowhere())
        self.base: TrainableModel | None = None  # the starting model: every served copy's base
        self.frozen: Policy | None = None
        self.serving = VersionedPolicy(f"{cfg.model.kind} (training)")
        self.fleet: Any = None  # (an SGLang fleet) this worker's client of it, a follower

    def check(self) -> str:
        """Build what every episode needs here (each world at each team size, the starting
        model), so that a node that lacks a world file says so before training starts."""
        from collective.engine.organisation import make_organisation
        from collective.engine.registry import check_runnable

        cfg = self.cfg
        for episode in first_configs(cfg):
            check_runnable(episode)
        if self.backend is None:
            return socket.gethostname()
        self.base = self.backend.fresh() if not cfg.init else self.backend.load(cfg.init)
        if make_organisation(cfg.org).name == "orchestrator":
            self.frozen = self.backend.frozen(self.base)
        return socket.gethostname()

    def pid(self) -> int:
        """The worker's process id (the tests kill it)."""
        return os.getpid()

    def _follower(self, fleet: Fleet) -> Any:
        """This worker's client of the SGLang fleet, following the version the share is
        pinned to (see ``SGLangPolicy.follow``)."""
        from policy.sglang.client import SGLangPolicy

        args, version, label = fleet
        if self.fleet is None or self.fleet.urls != tuple(args["urls"]):
            self.fleet = SGLangPolicy(**args)
        self.fleet.follow(version, label)
        return self.fleet

    def run(
        self, share: Share, weights: dict[int, Any], fleet: Fleet | None = None
    ) -> Iterator[tuple[Any, ...]]:
        """Run a share of a step's episodes, yielding ``("episode", group, member, file
        bytes)`` as each finishes, then ``("batches", batches, requests)`` (its policy
        batching). ``weights`` maps each version the share is pinned to, to its object ref;
        with an SGLang fleet, ``fleet`` says where it is and which version to follow."""
        import ray

        from collective.engine.conductor import Conductor

        for v in sorted(set(weights) - set(self.serving.policies)):
            assert self.backend is not None and self.base is not None  # (built by check)
            policy = self.backend.policy_for(self.base, ray.get(weights[v]), v)
            self.serving.publish(v, policy, keep=self.cfg.lag)
        policies: Any = self.serving if fleet is None else self._follower(fleet)
        if self.frozen is not None:
            policies = {"trained": self.serving, "frozen": self.frozen}
        conductor = Conductor(policies)
        keys = {c.sample_seed: (g, i) for g, i, c in share}
        out: queue.Queue[tuple[Any, ...]] = queue.Queue()

        def play() -> None:  # trio in a thread: a generator cannot yield from inside trio.run
            def emit(ep: Episode) -> None:
                out.put(("episode", *keys[ep.config.sample_seed], episode_file_bytes(ep)))

            configs = [c for _, _, c in share]
            try:
                trio.run(lambda: conductor.play(configs, concurrency=self.concurrency, emit=emit))
                stats = conductor.batch_stats
                out.put(("batches", stats.batches, stats.requests))
            except BaseException as e:
                out.put(("error", e))

        threading.Thread(target=play, daemon=True, name="conductor").start()
        while True:
            item = out.get()
            if item[0] == "error":
                raise item[1]
            yield item
            if item[0] == "batches":
                return


def _nowhere() -> Path:
    return Path("/nonexistent-run-dir")


class RayRollouts(Rollouts):
    """Episodes run by Ray actors, a share of each step per worker; see the module docstring."""

    def __init__(self, args: RolloutArgs) -> None:
        super().__init__(args)
        cfg, first_step = self.cfg, self.first_step
        if uses_fleet(cfg) and cfg.cluster.address and cfg.hf.server.startswith("sglang:launch"):
            raise ValueError(
                "hf_server = 'sglang:launch...' starts SGLang on this machine's loopback, which "
                "the Ray cluster's other nodes cannot reach; start the servers on the GPU nodes "
                "and give their URLs (hf_server = 'sglang:http://gpu1:30000,...')"
            )
        self.fleet: Any = None  # (an SGLang fleet) the learner's client: it loads the weights
        self.in_flight = 0  # episodes dealt to workers and not yet received
        self._landed = trio.Event()  # set whenever in_flight reaches 0
        self._updating = trio.Lock()  # fleet updates, one at a time, in version order
        self._updates_pending = 0
        self._updated = trio.Event()  # set whenever an update is done
        self.cluster = cfg.cluster
        self.ray = import_ray()
        self.started_ray = False
        self.refs: dict[int, Any] = {}  # version -> object ref of its weights
        self.latest = first_step  # the newest version published
        self.next_step = first_step  # the first step not yet dealt to workers
        self.workers: list[Any] = []
        self.generation: list[int] = []  # bumped on every replacement of worker k
        # Set while worker k's replacement is being checked: its other shares wait on it, since
        # a run sent to the new worker before its check would find nothing built.
        self._replacing: dict[int, trio.Event] = {}
        self.replaced = 0  # workers replaced after dying (for the log and the tests)
        self.batches = self.requests = 0  # the workers' policy batches, summed
        self._actor: Any = None
        self._nursery: trio.Nursery | None = None
        self.concurrency = max(1, cfg.concurrency // cfg.cluster.rollout_workers)
        self._waiting: trio.CapacityLimiter | None = None

    @property
    def batch_mean(self) -> float:
        """Mean policy batch size over the workers' finished shares."""
        return self.requests / self.batches if self.batches else 0.0

    # -- start and stop -------------------------------------------------------------------------

    def start(self) -> None:
        """Connect (or start Ray), check resources, start the workers and have each build what
        its episodes need: every way this can fail is a one-line ValueError, before training."""
        c = self.cluster
        self.started_ray = connect(c)
        try:
            check_resources(c)
            self._actor = self.ray.remote(RolloutWorker)
            self.workers = [self._new_worker() for _ in range(c.rollout_workers)]
            self.generation = [0] * c.rollout_workers
            for k, w in enumerate(self.workers):
                self._checked(k, w)
            for v, w in self.serving_weights.items():
                self.refs[v] = self.ray.put(w)
        except BaseException:
            self.close()
            raise

    def _new_worker(self) -> Any:
        return self._actor.options(num_cpus=self.cluster.cpus_per_worker).remote(
            self.cfg, self.concurrency
        )

    def _checked(self, k: int, worker: Any) -> str:
        try:
            return self.ray.get(worker.check.remote(), timeout=600)
        except self.ray.exceptions.RayTaskError as e:
            cause = e.cause if isinstance(e.cause, BaseException) else e
            raise ValueError(f"rollout worker {k}: {_one_line(cause).split(': ', 1)[1]}") from None
        except self.ray.exceptions.RayActorError as e:  # it failed to start at all
            raise ValueError(f"rollout worker {k} could not start: {_one_line(e)}") from None
        except self.ray.exceptions.GetTimeoutError:
            raise ValueError(
                f"rollout worker {k} did not start within 600 s (is the cluster short of "
                "resources?)"
            ) from None

    def close(self) -> None:
        for w in self.workers:
            with contextlib.suppress(Exception):  # already dead, or Ray down: nothing to stop
                self.ray.kill(w)
        self.workers = []
        if self.started_ray and self.ray.is_initialized():
            self.ray.shutdown()
            self.started_ray = False

    # -- the seam -------------------------------------------------------------------------------

    @asynccontextmanager
    async def running(self) -> AsyncIterator[RayRollouts]:
        # The threads that wait on workers' streams have their own limiter: trio's default one
        # (40 threads) is shared with the learner's thread, which must never wait behind them.
        self._waiting = trio.CapacityLimiter(1_000_000)
        try:
            if uses_fleet(self.cfg):  # (a resumed run's fleet is given its weights here)
                self.fleet = await self.backend.serve(self.model, {})
                self.latest = self.fleet.version
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                self._deal()
                yield self
                # The run's last version reaches the fleet as locally, unless episodes are still
                # out (a run stopped early): they are abandoned, and the fleet keeps its version.
                while self.in_flight == 0 and self._updates_pending:
                    await self._updated.wait()
                nursery.cancel_scope.cancel()
        finally:
            self._nursery = None
            self.close()

    async def publish(self, version: int, weights: Weights) -> None:
        if self.fleet is not None:
            # The fleet loads this version once no episode is left running on the version it
            # holds, and the learner goes on changing the model meanwhile, so the version is
            # kept as it is now: written to disk, or, when the fleet takes weights from memory
            # (``weights=tensor|distributed|auto``), as a frozen copy of the model (a model's
            # memory per update still waiting), sent from this process and then dropped.
            kept: Path | TrainableModel
            if self._by_memory():
                hf_model: Any = self.model  # (a fleet is the hf backend's: an HFModel)
                kept = hf_model.copy(version=version)
            else:
                kept = self.model.save(self._served() / f"v{version:06d}")
            assert self._nursery is not None
            self._updates_pending += 1
            self._nursery.start_soon(self._update_fleet, version, kept)
            return
        self.refs[version] = self.ray.put(weights)
        self.latest = version
        for v in [v for v in self.refs if v < version - self.cfg.lag]:
            del self.refs[v]  # no episode still to run is pinned to it
        self._deal()

    def _served(self) -> Path:
        """Where the fleet's weights are written: the hf backend's (``checkpoints/served``)."""
        assert isinstance(self.backend, HFBackend)  # (a fleet is the hf backend's)
        return self.backend.weights_dir

    def _by_memory(self) -> bool:
        """The fleet takes weights without the disk, and has not fallen back to it."""
        return bool(self.fleet.by_memory)

    async def _update_fleet(self, version: int, kept: Path | TrainableModel) -> None:
        """Load ``version`` on every server of the fleet (pause, the load, checked
        weight_version, continue) once every episode dealt so far has come back, so that each
        episode is sampled by the one version it was dealt at; then deal the steps that version
        allows. ``kept`` is the version as ``publish`` kept it: a directory, loaded by
        update_weights_from_disk, or a frozen model, sent from memory as the local path sends
        the learner's (``HFBackend.publish``: if that cannot work, the copy is what is written
        to disk instead)."""
        import shutil

        async with self._updating:
            while self.in_flight:
                await self._landed.wait()
            if isinstance(kept, Path):
                await self.fleet.update_weights(kept, version)
                for old in self._served().glob("v*"):
                    if old.name < kept.name:
                        shutil.rmtree(old, ignore_errors=True)
            else:
                await self.backend.publish(kept, version, {})
            self.latest = version
            self._updates_pending -= 1
            self._updated.set()
            self._updated = trio.Event()
            self._deal()

    # -- dealing steps to workers ---------------------------------------------------------------

    def _deal(self) -> None:
        """Deal every step whose episodes' version exists, round-robin over the workers."""
        cfg = self.cfg
        B, G, N = cfg.groups_per_step, cfg.group_size, self.cluster.rollout_workers
        while self.next_step < cfg.steps and self.latest >= max(0, self.next_step - cfg.lag):
            step = self.next_step
            self.next_step += 1
            version = max(0, step - cfg.lag) if cfg.sync == "pinned" else self.latest
            fleet: Fleet | None = None
            if self.fleet is not None:  # the fleet holds one version: the one it has now
                fleet = (self.fleet.follower_args(), self.fleet.version, self.fleet.label)
                version = -1  # in the episode's config, as locally: "what the server holds"
            todo: Share = [
                (g, i, team_config(cfg, g, i, version))
                for g in range(step * B, (step + 1) * B)
                for i in range(G)
                if (g, i) not in self.on_disk
            ]
            self.in_flight += len(todo)
            assert self._nursery is not None
            for k in range(N):
                if todo[k::N]:
                    self._nursery.start_soon(self._drive, k, todo[k::N], fleet)

    async def _drive(self, k: int, share: Share, fleet: Fleet | None) -> None:
        """Run a share on worker k until every episode of it has finished, replacing the
        worker if it dies and running what it had not finished on the new one."""
        left = {(g, i): c for g, i, c in share}
        fruitless = 0
        while left:
            while (replacing := self._replacing.get(k)) is not None:
                await replacing.wait()
            worker, gen = self.workers[k], self.generation[k]
            versions = {c.policy_version for c in left.values()} - {-1}
            refs = {v: self.refs[v] for v in versions}
            before = len(left)
            try:
                await trio.to_thread.run_sync(
                    self._stream,
                    worker,
                    [(g, i, c) for (g, i), c in left.items()],
                    refs,
                    fleet,
                    left,
                    abandon_on_cancel=True,
                    limiter=self._waiting,
                )
            except self.ray.exceptions.RayActorError as e:
                fruitless = 0 if len(left) < before else fruitless + 1
                if fruitless >= 2:
                    raise RuntimeError(
                        f"rollout worker {k} died twice running the same episodes without "
                        f"finishing one ({_one_line(e)})"
                    ) from None
                if self.generation[k] == gen:  # the first of its shares to notice replaces it
                    await self._replace(k, e)
            except self.ray.exceptions.RayTaskError as e:
                # An episode failed in the worker (a policy's error, a server refusing): the
                # run stops with that error, as it would locally, not Ray's wrapping of it.
                if isinstance(e.cause, Exception):
                    raise e.cause from None
                raise

    async def _replace(self, k: int, why: BaseException) -> None:
        self.generation[k] += 1
        self.replaced += 1
        self._replacing[k] = ready = trio.Event()
        log.warning("rollout worker died; replacing it", worker=k, why=_one_line(why))
        with contextlib.suppress(Exception):  # it is dead already, as a rule
            self.ray.kill(self.workers[k])
        try:
            self.workers[k] = self._new_worker()
            await trio.to_thread.run_sync(self._checked, k, self.workers[k], abandon_on_cancel=True)
        finally:
            del self._replacing[k]
            ready.set()

    def _stream(
        self,
        worker: Any,
        share: Share,
        refs: dict[int, Any],
        fleet: Fleet | None,
        left: dict[tuple[int, int], EpisodeConfig],
    ) -> None:
        """(In a thread.) Receive a share's episodes as the worker finishes them; each is saved
        and buffered by the trio side before the next is taken."""
        for ref in worker.run.options(num_returns="streaming").remote(share, refs, fleet):
            item = self.ray.get(ref)
            if item[0] == "batches":
                self.batches += item[1]
                self.requests += item[2]
                continue
            _, g, i, data = item
            ep = decode_episode(data, f"episode g{g}-r{i} from a rollout worker")
            trio.from_thread.run(self.finished, g, i, ep)
            if left.pop((g, i), None) is not None:
                trio.from_thread.run_sync(self._land)

    def _land(self) -> None:
        self.in_flight -= 1
        if not self.in_flight:
            self._landed.set()
            self._landed = trio.Event()


# -- the learner where the GPU is ---------------------------------------------------------------


class LearnerHost:
    """A Ray actor holding ``learner_gpus`` GPUs that runs the training loop itself: the learner
    on its GPU, the run directory on its node, the rollout workers started from it. (Decorated
    with ``ray.remote`` when a run starts.)"""

    def train(
        self,
        train: Callable[..., list[Any]],
        cfg: TrainConfig,
        run_dir: str,
        resume: bool,
        stop_after: int | None,
    ) -> list[bytes]:
        import msgspec

        rows = train(cfg, run_dir, resume=resume, progress=False, stop_after=stop_after)
        return [msgspec.json.encode(r) for r in rows]


def train_on_learner_node(
    train: Callable[..., list[Any]],
    cfg: TrainConfig,
    run_dir: str,
    *,
    resume: bool,
    stop_after: int | None,
    gpus: float | None = None,
) -> list[bytes]:
    """Run ``train`` (``collective.rl.train.train``, handed in: this module sits below the loop
    and never imports it) in a :class:`LearnerHost` actor placed on a node with ``gpus`` GPUs
    (``cluster.learner_gpus``; Ray's ``num_gpus``), and wait for it (``collective.rl.launch``
    decides a run goes there). If the actor dies, the run stops as it stood at its last
    finished step, which ``--resume`` continues."""
    ray = import_ray()
    gpus = cfg.cluster.learner_gpus if gpus is None else gpus
    started = connect(cfg.cluster)
    try:
        check_resources(cfg.cluster, learner_cpus=1.0)
        host = (
            ray.remote(LearnerHost)
            .options(num_gpus=gpus, num_cpus=1, name=LEARNER_NAME, max_restarts=0)
            .remote()
        )
        try:
            return ray.get(host.train.remote(train, cfg, run_dir, resume, stop_after))
        except ray.exceptions.RayActorError as e:
            raise LearnerDied(
                f"the learner actor died ({_one_line(e)}); the run stopped at its last finished "
                "step"
            ) from None
        except ray.exceptions.RayTaskError as e:
            cause = e.cause if isinstance(e.cause, BaseException) else e
            if isinstance(cause, ValueError):  # a check that failed on the learner's node
                raise ValueError(str(cause)) from None
            raise
        finally:  # done, failed or Ctrl-C: the actor goes (its last finished step is on disk)
            with contextlib.suppress(Exception):
                ray.kill(host)
    finally:
        if started:
            ray.shutdown()


LEARNER_NAME = "collective-learner"


class LearnerDied(RuntimeError):
    """The learner actor was lost; the run directory holds a resumable state."""


# -- tasks over workers (the scale study's cells) -----------------------------------------------


def tasks_on_workers(
    task: Callable[..., Any], jobs: list[tuple[Any, ...]], cluster: ClusterConfig, shared: Any
) -> Iterator[Any]:
    """``task(*job, shared)`` for every job as Ray tasks, ``cluster.rollout_workers`` at a time
    with ``cpus_per_worker`` CPUs each, results yielded in job order as they complete;
    ``shared`` goes to Ray's object store once. (``collective.studies.study`` hands in its cells:
    this
    module never imports the study.)"""
    ray = import_ray()
    started = connect(cluster)
    try:
        check_resources(cluster)
        remote = ray.remote(task).options(num_cpus=cluster.cpus_per_worker, max_retries=3)
        ref = ray.put(shared)
        refs: list[Any] = []
        for k, job in enumerate(jobs):
            refs.append(remote.remote(*job, ref))
            if k + 1 >= cluster.rollout_workers:  # a window: as many tasks in flight as workers
                yield ray.get(refs[k + 1 - cluster.rollout_workers])
        for r in refs[max(0, len(jobs) - cluster.rollout_workers + 1) :]:
            yield ray.get(r)
    finally:
        if started:
            ray.shutdown()
