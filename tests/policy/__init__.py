"""Tests of ``policy/``: the tiny, Hugging Face and SGLang policies and their grammars."""
