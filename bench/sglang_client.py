"""What the SGLang client itself costs a request (issue 29, item 5).

The client's CPU time per request, at batch 1 to 1,024, against the strict stand-in server
(``tests/support/sglang_fake.py``) run as its own process, so this process's CPU time is the
client's alone: tokenising each prompt, building its grammar string and sampling parameters,
encoding the JSON body, the HTTP exchange, decoding the answer and checking every token. The
requests are a workshop episode's own (its prompts at the start of an episode and its action
space), the model is ``collective make-model tiny-lm``'s. Each batch size is timed ``--repeats``
times, interleaved, and the median kept; one batch of the largest size is profiled to split the
time by where it goes (the tokenizer, JSON, HTTP, the client's own Python). The issue's target
is at most 0.5 ms of client CPU a request at batch 1,024. Then, beside it, the engine's share
of an ``hf:`` run's CPU (``hf_share``: one workshop episode on the in-process policy over the
same model).

    python bench/sglang_client.py            # ~2-4 min on 2 cores
    python bench/sglang_client.py --quick    # batch 1 to 64, ~30 s

Writes ``bench/results/sglang_client/`` (``client_cost.json``, ``client_cost.png``).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio
from tqdm import tqdm

from collective import Cast, EpisodeConfig
from collective.base.seeding import derive
from collective.rl.make_model import make_tiny_lm
from policy.base import PolicyRequest
from policy.sglang.client import SGLangPolicy

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "results" / "sglang_client"
FAKE = ROOT / "tests" / "support" / "sglang_fake.py"
TARGET_MS = 0.5


def workshop_requests(n: int, max_tokens: int) -> list[PolicyRequest]:
    """``n`` requests as a workshop episode of ``n`` agents asks them at its start: each agent's
    own prompt (its desk, its inbox, its last result) under the workshop's action space."""
    cast = Cast(EpisodeConfig(world="workshop", agents=n))
    world, space = cast.worlds[0], cast.space_for("worker", 0)
    return [
        PolicyRequest(
            agent=a,
            turn=0,
            prompt=f"{world.observe(a)}\nlast: you have just started\n>",
            space=space,
            seed=derive(7, a),
            max_tokens=max_tokens,
        )
        for a in range(n)
    ]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_fake(model: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            str(FAKE),
            "--model-path",
            str(model),
            "--port",
            str(port),
            "--enable-deterministic-inference",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.1):
                return proc, url
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"the stand-in server did not start on {url}")


def timed(policy: SGLangPolicy, requests: list[PolicyRequest]) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one ``generate`` of ``requests``."""
    cpu0, wall0 = time.process_time(), time.perf_counter()
    out = trio.run(policy.generate, requests)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    if len(out) != len(requests):
        raise RuntimeError(f"{len(out)} answers to {len(requests)} requests")
    return cpu, wall


WHERE = {
    "tokenizer": ("tokenizers", "transformers", "jinja2"),
    "JSON": ("json", "msgspec"),
    "HTTP": ("httpx", "httpcore", "h11", "socket", "ssl", "select", "selectors", "anyio"),
    "trio": ("trio", "outcome"),
}


def _in(where: str, package: str) -> bool:
    """Whether a profiled function belongs to ``package``: its file is in the package's folder
    or is its module (json/__init__.py, socket.py), or, a builtin, it names the package's type
    ("<method 'encode_batch' of 'tokenizers.Tokenizer' objects>")."""
    return f"/{package}/" in where or f"/{package}.py" in where or f"'{package}." in where


def split_by_where(profile: cProfile.Profile) -> dict[str, float]:
    """A CPU-time profile's own time (tottime) by where it was spent: the groups of ``WHERE``,
    the project's code (the client, the prompt builder, the action space), and the rest."""
    stats = pstats.Stats(profile)
    out: dict[str, float] = {}
    for (path, _, func), row in stats.stats.items():  # type: ignore[attr-defined]
        where = f"{path}:{func}"
        name = next(
            (k for k, parts in WHERE.items() if any(_in(where, p) for p in parts)),
            "the project's code" if str(ROOT) in path else "other (stdlib, builtins)",
        )
        out[name] = out.get(name, 0.0) + row[2]
    return out


class CPUTimed:
    """A policy wrapped to add up the CPU time its ``generate`` calls take in this process."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.cpu = inner, 0.0
        self.name, self.version = inner.name, inner.version
        self.tokenizer_name = getattr(inner, "tokenizer_name", "")

    async def generate(self, requests: list[PolicyRequest]) -> list[Any]:
        t0 = time.process_time()
        try:
            return await self.inner.generate(requests)
        finally:
            self.cpu += time.process_time() - t0

    async def aclose(self) -> None:
        await self.inner.aclose()


def hf_share(model: Path, agents: int, limit: float) -> dict[str, float]:
    """The engine's share of an ``hf:`` run's CPU: one workshop episode of ``agents`` agents and
    ``limit`` simulated seconds on the in-process policy over ``model``; everything the policy's
    ``generate`` does is the policy's, the rest (the engine, the world, the record) the engine's."""
    from collective.engine.conductor import run_episodes
    from policy.factory import make_policy

    policy = CPUTimed(make_policy(f"hf:{model}"))
    cfg = EpisodeConfig(world="workshop", agents=agents, time_limit=limit, max_output_tokens=24)
    t0 = time.process_time()
    (ep,) = run_episodes([cfg], policy)
    total = time.process_time() - t0
    return {
        "agents": agents,
        "time_limit": limit,
        "turns": ep.stats.turns,
        "cpu_s": total,
        "policy_cpu_s": policy.cpu,
        "engine_share": (total - policy.cpu) / total,
        "engine_cpu_ms_per_turn": (total - policy.cpu) / max(ep.stats.turns, 1) * 1e3,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="batch 1 to 64")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--max-tokens", type=int, default=24)
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args(argv)
    sizes = [1, 4, 16, 64] if a.quick else [1, 4, 16, 64, 256, 1024]
    out = a.out or (OUT / "quick" if a.quick else OUT)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        model = make_tiny_lm(Path(tmp) / "tiny-lm")
        proc, url = start_fake(model)
        try:
            policy = SGLangPolicy(url, tokenizer=model, timeout=600.0, deadline=3600.0)
            requests = workshop_requests(max(sizes), a.max_tokens)
            timed(policy, requests[:1])  # the first call checks the server and loads the tokenizer
            runs: dict[int, list[tuple[float, float]]] = {n: [] for n in sizes}
            jobs = [n for _ in range(a.repeats) for n in sizes]
            for n in tqdm(jobs, desc="client cost", unit="batch"):
                runs[n].append(timed(policy, requests[:n]))
            profile = cProfile.Profile(time.process_time)  # CPU time, not waits
            profile.enable()
            timed(policy, requests[: max(sizes)])
            profile.disable()
        finally:
            proc.kill()
            proc.wait()
        share = hf_share(model, 8, 30.0 if a.quick else 120.0)
    rows = []
    for n in sizes:
        cpu = sorted(c for c, _ in runs[n])[len(runs[n]) // 2]
        wall = sorted(w for _, w in runs[n])[len(runs[n]) // 2]
        rows.append(
            {
                "batch": n,
                "client_cpu_ms_per_request": cpu / n * 1e3,
                "wall_ms_per_request": wall / n * 1e3,
                "cpu_s": [round(c, 4) for c, _ in runs[n]],
            }
        )
    where = split_by_where(profile)
    total = sum(where.values())
    shares = {k: v / total for k, v in sorted(where.items(), key=lambda kv: -kv[1])}
    prompt_bytes = sorted(len(r.prompt.encode()) for r in requests)
    result = {
        "sizes": sizes,
        "repeats": a.repeats,
        "max_tokens": a.max_tokens,
        "prompt_bytes_median": prompt_bytes[len(prompt_bytes) // 2],
        "rows": rows,
        "profile_batch": max(sizes),
        "profile_shares": shares,
        "target_ms_at_1024": TARGET_MS,
        "hf_run": share,
    }
    (out / "client_cost.json").write_text(json.dumps(result, indent=1) + "\n")
    print("batch  client CPU ms a request  wall ms a request (the stand-in's decoding included)")
    for r in rows:
        print(
            f"{r['batch']:>5} {r['client_cpu_ms_per_request']:>24.3f} "
            f"{r['wall_ms_per_request']:>18.3f}"
        )
    print(
        f"where the client's CPU goes at batch {max(sizes)}: "
        + ", ".join(f"{k} {v:.0%}" for k, v in shares.items())
    )
    print(
        f"an hf: workshop episode ({share['agents']} agents, {share['time_limit']:g} s, "
        f"{share['turns']} turns): {share['cpu_s']:.1f} CPU s, the engine's share "
        f"{share['engine_share']:.1%} ({share['engine_cpu_ms_per_turn']:.2f} ms a turn)"
    )
    plot(result, out / "client_cost.png")
    print(f"wrote {out}")
    return 0


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([r["batch"] for r in rows], [r["client_cpu_ms_per_request"] for r in rows], marker="o")
    ax.axhline(result["target_ms_at_1024"], color="grey", ls=":", label="target at 1,024")
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="requests in one generate()",
        ylabel="client CPU ms a request (median)",
        title="The SGLang client's own cost (stand-in server in its own process)",
    )
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
