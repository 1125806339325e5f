"""The conformance checks, one module per concern; importing this module registers them all with
`core.check`, in the order the kit lists and runs them:

- `module_checks`: what every component is as a torch module: build, forward, gradients,
  state_dict, meta;
- `declaration_checks`: its declarations against its module: params (and buffers), flops,
  activations;
- `runtime_checks`: beyond one eager forward: compile, cache (a KV cache, in a model) and
  documents (a packed row, in a model: no document sees another);
- `kind_checks`: one kind's own contract: per_token (norm, ffn), keys and residual (block),
  features and relative (pos);
- `attention_checks`: the attention kernels' (a float64 reference, causality, masks, biases,
  grouped-query heads, scale, soft-capping, window);
- `mixer_checks`: the token mixers' (causality; decoding token by token and after a prefill
  against the parallel forward, with the state it leaves; the declared state bytes);
- `recipe_checks`: the training recipe's kinds, built as `lmcore train` builds them: an
  optimizer's groups, learning rates, resume, a quadratic and bfloat16; a schedule's values,
  edges, warmup and purity;
- `adapter_checks`: the adapter kind's, in a small model: init (logits unchanged), trainable
  (gradients reach only the adapter), merge (merged = unmerged) and state (a round trip);
- `coord_checks`: muP's coordinate check on every model component and parametrization: how
  far a few training steps move each activation does not depend on the width.
- `quant_checks`: the weight formats': the matmul against the float reference within the
  tolerance it declares, rounding, the stored bytes, and a model's state round trip.

Each check builds the component at the kit's small test shapes, runs it on seeded random inputs
and raises `ConformanceError` with a sentence naming what broke and how to fix it.
"""

from __future__ import annotations

# The order of these imports is the order of the checks.
# isort: off
from lmcore.testing import (  # noqa: F401  (imported for the checks they register)
    module_checks,
    declaration_checks,
    runtime_checks,
    kind_checks,
    attention_checks,
    mixer_checks,
    recipe_checks,
    adapter_checks,
    coord_checks,
    quant_checks,
)
# isort: on
