"""The smallest end-to-end check: parse an example, print it, re-parse it, run it."""

from pathlib import Path

import gir
import numpy as np

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_rnn_round_trip_and_run():
    module = gir.load(str(EXAMPLES / "rnn.gir"))
    text = str(module)
    assert str(gir.parse(text)) == text
    rng = np.random.default_rng(0)
    f = module.functions["rnn_loss"]
    args = [(0.1 * rng.standard_normal(t.shape)).astype(np.float32) for t in f.arg_types]
    (loss,) = gir.interpret(module, "rnn_loss", *args)
    xs, h0, wx, wh, b = args
    h, ref = h0, 0.0
    for x in xs:
        h = np.tanh(x @ wx + h @ wh + b)
        ref += float((h * h).sum())
    assert np.isclose(loss, ref, rtol=1e-4)
