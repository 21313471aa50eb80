"""Policies by name, as the command line and configs give them.

``random``; ``tiny`` (fresh weights from the given seed) or ``tiny:PATH`` (a checkpoint);
``hf:DIR`` (a Hugging Face model directory, sampled in this process); ``roles:DIR`` (a tiny
checkpoint per role, ``DIR/ROLE/latest.pt``: a ``role_policies`` run's ``checkpoints/roles``);
``sglang:URL[,URL...] [OPTION=VALUE ...]`` (a fleet of running servers) or
``sglang:launch:MODEL [OPTION=VALUE ...] [-- SGLANG_ARG ...]`` (the options and the spec's syntax
are in :mod:`policy.sglang.spec`).
"""

from __future__ import annotations

from policy.base import Policy


def make_policy(spec: str, *, seed: int = 0) -> Policy:
    name, _, arg = spec.partition(":")
    if name == "random" and not arg:
        from policy.uniform import RandomPolicy

        return RandomPolicy()
    if name == "tiny":
        return _tiny(arg, seed)
    if name == "hf":
        if not arg:
            raise ValueError("hf:DIR needs a model directory")
        from policy.hf.policy import load_hf_policy

        return load_hf_policy(arg)
    if name == "sglang":
        return _sglang(arg)
    if name == "roles":
        if not arg:
            raise ValueError("roles:DIR needs a directory of ROLE/latest.pt checkpoints")
        from policy.roles import load_role_policy

        return load_role_policy(arg)
    raise ValueError(
        f"unknown policy {spec!r}; policies are: random, tiny, tiny:PATH, hf:DIR, sglang:URL, "
        "sglang:launch:MODEL, roles:DIR"
    )


def _tiny(path: str, seed: int) -> Policy:
    from policy.tiny import TinyConfig, TinyModel, TinyPolicy

    if not path:
        model = TinyModel.fresh(TinyConfig(seed=seed))
        return TinyPolicy(model, name=f"tiny (fresh weights, seed {seed})")
    return TinyPolicy(TinyModel.load(path), name=f"tiny:{path}")


def _sglang(arg: str) -> Policy:
    from policy.sglang.client import policy_from_spec

    return policy_from_spec(arg)
