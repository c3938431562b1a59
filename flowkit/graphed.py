r"""Sampling replayed from a CUDA graph: one launch for the whole solve.

Sampling a MAF (or a Bernoulli/categorical MADE, or scoring outside points with an IAF) solves
``D`` features one after the other (:mod:`flowkit.nn.inversion`), each step a handful of small
tensor operations. On a GPU every operation is a kernel launch of a few microseconds, so a
``D = 64`` flow of 5 layers spends its time launching kernels, not computing (docs/performance.md,
"On a GPU"). :class:`GraphedSampler` records one call of the model's ``sample`` (or
``sample_and_log_prob``) for a fixed sample shape and context shape as a
:class:`torch.cuda.CUDAGraph`, and each later call replays the recording: the same kernels on
the same memory, launched as one, with new random noise each time (CUDA graphs advance the
generator's offset on every replay).

What is fixed at capture, and what is not:

* The sample shape, the context's shape, and the model's device and dtype. The model is in
  evaluation mode (``model.eval()``; checked at each call).
* The graph reads the weights where they are stored, and values derived from them that the
  model caches between calls (the masked products ``W * M``, the solver's sorted weights,
  :mod:`flowkit.nn.caches`), which would be stale after an update. So before each replay the
  sampler compares what identifies the weights (every parameter's and buffer's storage and
  version counter, the optimizer steps that updated each masked weight) and the cached objects
  with what they were at capture, and records the call again when they differ, which costs
  about four eager calls: after every optimizer step, or after a call with autograd (which
  drops the caches). It keeps the cached objects it read alive until then. Writes through
  ``.data`` bump no counter: after those, call :meth:`GraphedSampler.capture`.
* The context is copied into the buffer the graph reads (``sampler(context)``; ``sampler()``
  samples again given the last one, as for many posterior draws given one observation); its
  NaN check reads it back to the host, as in :meth:`flowkit.Flow.sample` (switch it off with
  :func:`flowkit.validation.validate_values`).
* The samples are returned as fresh tensors (a copy of the graph's output memory, which the
  next replay overwrites).

No gradients: a graph records one forward computation; for reparameterized samples use the
model's ``rsample``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from flowkit.nn.caches import cached
from flowkit.nn.linear import MaskedLinear
from flowkit.validation import (
    SampleShape,
    check_batch_context,
    check_bool,
    check_sample_arguments,
    reference,
    validate_values,
)

WARMUP = 3
"""Eager calls on a side stream before a capture: they build the caches (masked products,
sorted weights, the solver's program) that the graph then reads, and let cuDNN/cuBLAS pick
their algorithms outside the capture, as :func:`torch.cuda.graph` requires."""


class GraphedSampler:
    r"""``model.sample(n, context)`` captured once in a CUDA graph and replayed.

    Args:
        model: a CUDA model in evaluation mode with ``sample(n, context)``: a
            :class:`flowkit.Flow`, :class:`flowkit.BernoulliMADE` or
            :class:`flowkit.CategoricalMADE`.
        n: the number of samples or sample shape of every call, as ``model.sample`` takes it
            (an int, a tuple, or None for one sample per context row).
        context: an example context, ``(*B, C)``, for a conditional model (its shape is fixed;
            its values can change at each call); None otherwise.
        log_prob: also return the samples' log-density (``model.sample_and_log_prob``; a
            :class:`flowkit.Flow` only).

    Calling the sampler returns what ``model.sample(n, context)`` would,
    ``(*sample_shape, *B, D)``, drawn with new noise; with ``log_prob`` the pair of the samples
    and their log-density ``(*sample_shape, *B)``.

    Example (on a machine with a GPU)::

        flow = flowkit.MAF(64).cuda().eval()  # trained
        sampler = flowkit.GraphedSampler(flow, 1024)
        x = sampler()                      # (1024, 64), each call new samples
    """

    def __init__(
        self,
        model: nn.Module,
        n: SampleShape,
        context: Tensor | None = None,
        log_prob: bool = False,
    ):
        if not callable(getattr(model, "sample", None)):
            raise TypeError(
                "'model' should be a flowkit model with a 'sample' method (Flow, "
                f"BernoulliMADE, CategoricalMADE), got {type(model).__name__}"
            )
        self.log_prob = check_bool("log_prob", log_prob)
        if self.log_prob and not callable(getattr(model, "sample_and_log_prob", None)):
            raise TypeError(
                f"'log_prob' is True but {type(model).__name__} has no 'sample_and_log_prob'"
            )
        ref = reference(model)
        context_features = getattr(model, "context_features", 0)
        self.sample_shape, context = check_sample_arguments(n, context, context_features, ref)
        if ref is None or ref.device.type != "cuda":
            where = "no floating-point tensors" if ref is None else ref.device
            raise ValueError(
                f"'model' should be on a CUDA device (model.cuda()), it is on {where}: CUDA "
                "graphs record GPU work only"
            )
        self.model = model
        self._check_eval()
        self._device = ref.device
        self._context = None if context is None else context.detach().clone()
        self._graph: torch.cuda.CUDAGraph | None = None
        self._out: tuple[Tensor, ...] = ()
        self._state: tuple = ()
        self._kept: tuple[object | None, ...] = ()
        self.capture()

    def _check_eval(self) -> None:
        if any(m.training for m in self.model.modules()):
            raise ValueError(
                "'model' (or one of its modules) is in training mode: call model.eval() before "
                "sampling from a graph (in training mode a flow's first samples set its "
                "standardization, which a replayed graph would not redo)"
            )

    def _draw(self) -> tuple[Tensor, ...]:
        """One eager call of the model's sampling method on the context buffer."""
        with torch.no_grad():
            if self.log_prob:
                return tuple(self.model.sample_and_log_prob(self.sample_shape, self._context))
            return (self.model.sample(self.sample_shape, self._context),)

    def _weights_state(self) -> tuple:
        """What identifies the model's weights and their cached derived values now (see the
        module docstring)."""
        tensors = tuple((t.data_ptr(), t._version)
                        for t in [*self.model.parameters(), *self.model.buffers()])
        masked = tuple(m.cache_key() for m in self.model.modules() if isinstance(m, MaskedLinear))
        return tensors, masked, tuple(map(id, cached(self.model)))

    def capture(self) -> None:
        """Record the graph anew: warm-up calls on a side stream, then one captured call."""
        self._graph, self._out, self._kept = None, (), ()  # frees the previous graph's memory
        stream = torch.cuda.Stream(device=self._device)
        stream.wait_stream(torch.cuda.current_stream(stream.device))
        with validate_values(False), torch.cuda.stream(stream):
            for _ in range(WARMUP):
                self._draw()
        torch.cuda.current_stream(stream.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        try:
            with validate_values(False), torch.cuda.graph(graph):
                self._out = self._draw()
        except RuntimeError as error:
            raise RuntimeError(
                f"recording {type(self.model).__name__}.sample in a CUDA graph failed: an "
                "operation of the call is not allowed while capturing (a value read back to "
                "the host, a new allocation outside the graph's pool); sample eagerly instead"
            ) from error
        # what the graph read stays alive (the state compares identities, which a freed
        # object's successor could otherwise take over)
        self._graph, self._kept, self._state = graph, cached(self.model), self._weights_state()

    def __call__(self, context: Tensor | None = None) -> Tensor | tuple[Tensor, Tensor]:
        """New samples (and log-densities with ``log_prob``). A ``context`` replaces the
        values of the one the sampler holds (same shape, dtype and device); without one, the
        values last given (at construction or at an earlier call) are used again."""
        if context is not None:
            if self._context is None:
                raise ValueError("'context' was given but the sampler was captured without one")
            context = check_batch_context(context, self._context.shape[-1], self._context)
            if context.shape != self._context.shape:
                raise ValueError(
                    f"'context' should have the captured shape {tuple(self._context.shape)}, "
                    f"got {tuple(context.shape)} (capture another GraphedSampler for it)"
                )
            with torch.no_grad():
                self._context.copy_(context)
        self._check_eval()
        if self._graph is None or self._weights_state() != self._state:
            self.capture()
        assert self._graph is not None
        self._graph.replay()
        out = tuple(t.clone() for t in self._out)
        return out if self.log_prob else out[0]
