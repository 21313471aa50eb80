"""Episode file integrity: every single-byte change of a multi-MB episode is refused.

Records one large episode (the workshop world, many agents, a long time limit), then flips one
random bit of one random byte, ``--flips`` times, and loads each result: every load must fail
with an EpisodeFileError (the figure is how many did). Which check caught each change is
counted (the header, the length, the digest), and a sample of the flipped files goes through
the real command line (``collective replay``) to show each is one line of error, exit 2. The
cost of verifying is measured beside decoding, side by side in one process.

    python bench/integrity.py                # 1,000 flips; writes bench/results/integrity/
    python bench/integrity.py --flips 200 --cli 5 --out /tmp/integrity
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from collective import (
    EpisodeConfig,
    EpisodeFileError,
    run_episode,
)
from collective.records import HEADER_SIZE, decode_episode, episode_file_bytes
from policy.uniform import RandomPolicy

ROOT = Path(__file__).resolve().parent.parent

OUT = ROOT / "bench" / "results" / "integrity"


def record(agents: int, time_limit: float) -> bytes:
    cfg = EpisodeConfig(world="workshop", agents=agents, time_limit=time_limit, tokenizer="bytes")
    return episode_file_bytes(run_episode(cfg, RandomPolicy()))


def caught_by(message: str) -> str:
    for key, kind in (
        ("digest", "digest"),
        ("header says", "length"),
        ("not an episode file", "magic"),
        ("format", "format"),
        ("flags", "flags"),
    ):
        if key in message:
            return kind
    return "other"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--flips", type=int, default=1000)
    p.add_argument("--cli", type=int, default=20, help="flipped files also run through the CLI")
    p.add_argument("--agents", type=int, default=256)
    p.add_argument("--time-limit", type=float, default=3600.0)
    p.add_argument("--seed", type=int, default=0, help="which bytes are flipped")
    p.add_argument("--out", type=Path, default=OUT)
    a = p.parse_args()
    data = record(a.agents, a.time_limit)
    assert decode_episode(data) is not None
    rng = random.Random(a.seed)
    kinds: Counter[str] = Counter()
    accepted: list[int] = []
    header = 0
    samples: list[tuple[int, bytes]] = []
    t0 = time.perf_counter()
    for k in range(a.flips):
        at = rng.randrange(len(data))
        flipped = bytearray(data)
        flipped[at] ^= 1 << rng.randrange(8)
        header += at < HEADER_SIZE
        try:
            decode_episode(bytes(flipped))
        except EpisodeFileError as e:
            kinds[caught_by(str(e))] += 1
        else:
            accepted.append(at)
        if k < a.cli:
            samples.append((at, bytes(flipped)))
    flip_seconds = time.perf_counter() - t0

    cli: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for at, blob in samples:
            path = Path(tmp) / f"flip-{at}.msgpack"
            path.write_bytes(blob)
            done = subprocess.run(
                [sys.executable, "-m", "collective.cli", "replay", str(path)],
                capture_output=True,
                text=True,
                cwd=ROOT,
            )
            cli.append(
                {
                    "byte": at,
                    "exit": done.returncode,
                    "stderr_lines": done.stderr.count("\n"),
                    "traceback": "Traceback" in done.stderr,
                }
            )

    # What verifying costs beside decoding: the digest alone against the decode alone, the
    # two interleaved, best of 9 each, with the cyclic collector off (decoding makes millions of
    # objects; a collection landing in one timing and not the other would be all we measured).
    # The decode is the whole load (digest included); the digest's share is taken out of it.
    body = data[HEADER_SIZE:]
    hashing, decoding = [], []
    gc.collect()
    gc.disable()
    try:
        for _ in range(9):
            t = time.perf_counter()
            h = hashlib.blake2b(body, digest_size=32)
            h.update(data[:20])
            h.digest()
            hashing.append(time.perf_counter() - t)
            t = time.perf_counter()
            decode_episode(data)
            decoding.append(time.perf_counter() - t)
    finally:
        gc.enable()
    verified = min(hashing)
    bare = min(decoding) - verified
    result = {
        "episode_bytes": len(data),
        "agents": a.agents,
        "time_limit": a.time_limit,
        "flips": a.flips,
        "rejected": a.flips - len(accepted),
        "accepted_at": accepted,
        "in_header": header,
        "caught_by": dict(kinds),
        "flip_seconds": round(flip_seconds, 2),
        "cli_samples": len(cli),
        "cli_exit_2_one_line": sum(
            c["exit"] == 2 and c["stderr_lines"] == 1 and not c["traceback"] for c in cli
        ),
        "digest_seconds": round(verified, 5),
        "decode_seconds": round(bare, 5),
        "verify_overhead": round(verified / bare, 3),
    }
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "integrity.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "accepted_at"}))
    print(
        f"{result['rejected']} of {a.flips} single-byte changes of a "
        f"{len(data) / 1e6:.1f} MB episode refused; {result['cli_exit_2_one_line']} of "
        f"{len(cli)} via `collective replay`: exit 2, one line; the digest "
        f"costs {100 * result['verify_overhead']:.0f}% of the decode's time"
    )
    return 0 if not accepted else 1


if __name__ == "__main__":
    sys.exit(main())
