"""Hypothesis strategies shared by the test modules (imported as ``strategies``: pytest puts
``tests/`` on the import path of the modules it collects from it)."""

from hypothesis import strategies as st


@st.composite
def made_configs(draw, max_features: int, hidden: tuple[int, int], max_context: int,
                 inputs_per_feature: bool = False):
    """``(MADE keyword arguments, index of a mask set)``: random shapes, orderings, mask sets,
    contexts, residual blocks (equal hidden sizes) and direct connections. ``hidden`` bounds
    the width of each hidden layer; ``inputs_per_feature`` also draws ``m`` in 1..3."""
    features = draw(st.integers(1, max_features))
    residual = draw(st.booleans())
    width = st.integers(*hidden)
    if residual:
        layers = (draw(width),) * draw(st.integers(1, 3))
    else:
        layers = tuple(draw(st.lists(width, min_size=0, max_size=3)))
    num_masks = draw(st.integers(1, 3)) if features > 1 else 1  # one feature: one mask set
    config = dict(
        features=features,
        hidden_features=layers,
        params_per_feature=draw(st.integers(1, 3)),
    )
    if inputs_per_feature:
        config["inputs_per_feature"] = draw(st.integers(1, 3))
    config.update(
        context_features=draw(st.integers(0, max_context)),
        order="random" if num_masks > 1 else draw(st.sampled_from(["natural", "reversed",
                                                                    "random"])),
        hidden_degrees=draw(st.sampled_from(["random", "even"])),
        num_masks=num_masks,
        direct_connection=draw(st.booleans()),
        residual=residual,
        seed=draw(st.integers(0, 1000)),
    )
    return config, draw(st.integers(0, num_masks - 1))
