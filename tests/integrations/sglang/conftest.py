"""A FAKE minimal `sglang.srt.plugins.hook_registry` (injected through sys.modules) for CPU tests of the
plugin wiring without sglang. It mimics the real registry's hook semantics (SGLang 0.5.23,
srt/plugins/hook_registry.py): AFTER fn(result, *args), AROUND fn(original, *args), classmethod /
staticmethod preserved. `apply(target_map)` patches the objects the test names for each target."""
import enum
import functools
import sys
import types

import pytest


class HookType(enum.Enum):
    BEFORE = "before"
    AFTER = "after"
    AROUND = "around"
    REPLACE = "replace"


class FakeHookRegistry:
    hooks: list = []

    @classmethod
    def register(cls, target, hook, hook_type=HookType.AFTER):
        cls.hooks.append((target, hook, hook_type))

    @classmethod
    def apply(cls, target_map):
        """target_map: dotted target -> (owner object, attribute name)."""
        for target, hook, ht in cls.hooks:
            if target not in target_map:
                continue
            owner, attr = target_map[target]
            raw = owner.__dict__.get(attr)
            kind = type(raw) if isinstance(raw, (classmethod, staticmethod)) else None
            original = raw.__func__ if kind else getattr(owner, attr)

            def make(original=original, hook=hook, ht=ht):
                if ht is HookType.AFTER:
                    @functools.wraps(original)
                    def w(*a, **k):
                        r = original(*a, **k)
                        m = hook(r, *a, **k)
                        return r if m is None else m
                elif ht is HookType.AROUND:
                    @functools.wraps(original)
                    def w(*a, **k):
                        return hook(original, *a, **k)
                else:
                    raise NotImplementedError(ht)
                return w

            w = make()
            setattr(owner, attr, kind(w) if kind else w)


@pytest.fixture
def fake_sglang(monkeypatch):
    FakeHookRegistry.hooks = []
    mods = {}
    for name in ("sglang", "sglang.srt", "sglang.srt.plugins", "sglang.srt.plugins.hook_registry"):
        mods[name] = types.ModuleType(name)
    mods["sglang.srt.plugins.hook_registry"].HookRegistry = FakeHookRegistry
    mods["sglang.srt.plugins.hook_registry"].HookType = HookType
    for name, m in mods.items():
        monkeypatch.setitem(sys.modules, name, m)
    monkeypatch.delenv("GLM5_FASTPATH", raising=False)
    monkeypatch.delenv("GLM5_FASTPATH_CONFIG", raising=False)
    return FakeHookRegistry
