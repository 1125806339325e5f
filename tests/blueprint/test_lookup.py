"""Each component a spec names, looked up and resolved: nested component values checked against
their declaration, defaults filled in, the canonical spec written."""

from __future__ import annotations

from lmcore import SpecError, build_model, parse_spec
from lmcore.model.counting import account
from tests.helpers.errors import raises_naming

BASE = "vocab_size=97, context_length=16, d_model=32, num_layers=6, num_heads=4, d_ff=48"


def test_nested_component_values_resolve_against_their_declaration() -> None:
    from torch import nn

    from lmcore import Arg, Component
    from lmcore.registry import scoped_registry

    class Pair(nn.Module):
        def __init__(self, d_model, d_ff, expert, shared=None, gate=False, device=None, dtype=None):
            super().__init__()
            self.expert = expert.create(d_model=d_model, d_ff=expert.kwargs().get("d_ff", d_ff),
                                        device=device, dtype=dtype)  # fmt: skip
            self.shared = (
                None
                if shared is None
                else shared.create(d_model=d_model, d_ff=d_ff, device=device, dtype=dtype)
            )

        def forward(self, x):
            return self.expert(x) + (0 if self.shared is None else self.shared(x))

    def params(d_model, d_ff, expert, shared):
        width = expert.kwargs().get("d_ff", d_ff)
        own = expert.count("params", d_model=d_model, d_ff=width)
        return own + (0 if shared is None else shared.count("params", d_model=d_model, d_ff=d_ff))

    pair = Component(kind="ffn", name="pair", build=Pair, params=params, args=(
        Arg("expert", "ffn", "swiglu", "the expert"),
        Arg("shared", "ffn", None, "a shared expert; none: no shared expert"),
        Arg("gate", bool, False, "an argument added later", written="changed"),
    ))  # fmt: skip
    with scoped_registry() as registry:
        registry.add(pair)
        spec = parse_spec(f"{BASE}, ffn=pair(expert=geglu(d_ff=16), shared=silu, gate=false)")
        assert "ffn=pair(expert=geglu(d_ff=16),shared=silu)," in str(spec)
        assert parse_spec(str(spec)) == spec
        assert "ffn=pair(expert=swiglu,shared=none)," in str(parse_spec(f"{BASE}, ffn=pair"))
        model = build_model(spec)
        assert account(spec).params == sum(p.numel() for p in model.parameters())
        assert tuple(model.layers[0].ffn.expert.w1.weight.shape) == (16, 32)
        for bad, facts, caret in (
            ("pair(expert=rmsnorm)", ("no installed plugin provides ffn 'rmsnorm'",), "^^^^^^^"),
            ("pair(expert=geglu(dff=1))", ("ffn 'geglu' has no argument 'dff'", "(did you mean 'd_ff'?)"), "^^^^^"),
            ("pair(expert=2)", ("argument 'expert' of ffn 'pair' takes a ffn component",
                                "e.g. expert=name or name(arg=value)", "got 2"), "^^^^^^^^"),
            ("pair(gate=swiglu(d_ff=2))", ("argument 'gate' of ffn 'pair'", "expects bool, got a component"), "^^^^^^^^^^^^^^^^^^^"),
            ("pair(expert=" * 9 + "swiglu" + ")" * 9, ("components nest at most 8 deep",), "^"),
        ):  # fmt: skip
            with raises_naming(SpecError, *facts) as e:
                parse_spec(f"{BASE}, ffn={bad}")
            assert str(e.value).splitlines()[-1].strip() == caret, str(e.value)
