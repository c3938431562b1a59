r"""``Standardize``: a fixed elementwise affine map ``z = (x - shift) / scale``.

Put first in a :class:`~flowkit.transforms.Compose`, it makes a flow indifferent to the units of
its data: the layers after it see numbers of order one whether the data came in metres or in
kilometres, and the exact log-determinant :math:`-\sum_d \log \mathrm{scale}_d` keeps the density
in the data's own units. The :func:`flowkit.MAF` and :func:`flowkit.IAF` builders put one before
their layers and one on the context (``standardize=True``), set from the training data.

Shift and scale are buffers, not parameters: saved and loaded with the model, moved with
``.to()``, never changed by an optimizer. They are either given (``Standardize(D, shift=...,
scale=...)`` or :meth:`Standardize.from_data`) or set from data on first use (``Standardize(D)``),
as ActNorm (Kingma and Dhariwal, "Glow", 2018) initialises itself:

* the first call of ``forward`` in training mode sets ``shift`` to the mean and ``scale`` to the
  standard deviation of that batch (per feature);
* the first call of ``inverse`` in training mode (sampling before any data was seen) sets the
  identity, ``shift = 0`` and ``scale = 1``;
* :func:`set_from_data` sets it from many batches at once (:func:`flowkit.fit` does this with
  its whole training set before the first step);
* until then (and in evaluation mode) an uninitialised ``Standardize`` is the identity.

A value set by a call is **provisional** (:attr:`Standardize.provisional`): :func:`set_from_data`,
and so :func:`flowkit.fit`, replace it, so that a look at a new flow (``flow.sample``, a
``log_prob`` on a few rows, an ``rsample`` to check shapes) before ``fit`` does not decide the
standardization. The states, and what moves a module from one to the next ("a data batch": a
training-mode ``forward`` with gradients on more than one row, outside a flow's sampling pass;
"a step": a ``torch.optim`` step that updates the flow's weights, see :func:`counting_steps_of`):

==================  ==============================================  ===============================
state               entered by                                      left by
==================  ==============================================  ===============================
unset               construction without values                     any call in training mode
                    (the identity until set)                        below; :func:`set_from_data`
fixed               values given, :meth:`Standardize.set`,          nothing (``set`` again)
                    :func:`set_from_data`, a load, a step after
                    samples trained through (below)
batch               a data batch while unset or a look: set from    :func:`set_from_data`; a step
                    it (the first step of a loop of one's own)      after sampling with gradients
look                while unset, a training-mode ``forward``        the first data batch;
                    without gradients, on one row, or on the        :func:`set_from_data`; a
                    contexts a flow samples at: set from it         step after sampling with
                                                                    gradients (fixed)
sampled identity    a training-mode ``inverse`` while unset         as a look, except that after
                    (sampling before any data): the identity        sampling with gradients only
                                                                    a data batch clearly in other
                                                                    units than the samples replaces
                                                                    it (a mean 10 s from theirs, a
                                                                    std above 10 s or, from 8 rows,
                                                                    below s / 100; s: their std, at
                                                                    least 1)
==================  ==============================================  ===============================

A training-mode ``inverse`` with gradients (reparameterized samples: training by reverse KL,
where the flow's samples are the data) notes the step count; once a step follows, the samples
were trained through and the value in use is fixed. Before that step data still replace it, so
that a Monte-Carlo look at a new flow (``flow().entropy()``, a ``kl_divergence``, an
``rsample((5,))``) before ``fit`` or a loop of one's own does not decide it (an
``rsample((5,))`` first left data near 1000 at the identity, a loss of 516 against 5.94); the
flow's own samples, and copies of them, are not "in other units" than the samples the identity
gave (the moments of all of them are kept until the step), however far from the origin its base
starts, so the identity they were drawn with stays (a base at a guess of (40, -25)
had its samples re-standardize the flow, 305 nats between ``sample_and_log_prob`` and
``log_prob``). A deep copy or pickle of the flow taken before that step forgets that its
samples had gradients (step counts do not carry over): there data replace the identity.
Updates written by hand (no ``torch.optim``) are not counted: such a loop should set the values
first (:meth:`Standardize.set` or :func:`set_from_data`). The contexts a flow samples at are
treated alike: with gradients they set the context standardization, which the first optimizer
step fixes (amortized variational inference).

One row has no spread: a value set from a single row, or copies of one (shift = that row,
scale = 1), gives way to the first training call with gradients on rows that differ. A loop
whose calls each see one row (a context shared by a batch, batches of one) keeps it, and a
warning says so once.

Code compiled with :func:`torch.compile` branches on what the host knows of the flag: while it
does not know the values set, a training-mode call sets them outside the graph (a graph break,
which ``fullgraph=True`` refuses: set the values before compiling there).

A feature whose standard deviation is zero, or below the resolution of the model's floating
type at its mean (a constant column), gets ``scale = 1``: it is only shifted.

**Robust** (``Standardize(D, robust=True)``; the builders' ``standardize="robust"``): the shift
is each feature's median and the scale its interquartile range divided by 1.349 (the standard
deviation of a normal distribution with that range), where that range is above the float
resolution at the median, else the mean and the standard deviation (a column mostly of one
value). A few gross outliers then leave the bulk
of the data at unit scale, where the mean and standard deviation would squeeze it into a
sliver (two rows at 10^6 among 2400 of unit spread: a scale of 3 * 10^4). The quartiles are of
the rows seen, up to :data:`ROBUST_ELEMENTS` values (a million rows of 8 features); past that,
of an even sample of them (every ``k``-th row seen).

**Full covariance** (``Standardize(D, covariance="full")``): after the elementwise step, the
lower Cholesky factor ``L`` of the features' correlation matrix is divided out,
``z = L^{-1} (x - shift) / scale``, so that the training data have the identity covariance (not
only unit variances) and a flow starts from a Gaussian fitted with all its correlations. ``L`` is
lower triangular, so ``z_i`` depends on ``x_1..x_i`` only (the map is itself autoregressive), and
``log|det dz/dx| = -\sum_d \log scale_d - \sum_d \log L_{dd}``. The correlation is shrunk
towards the identity, ``(1 - a) R + a I`` with ``a`` the oracle approximating shrinkage of the
rows (:func:`oas_shrinkage`), at least ``Standardize.SHRINKAGE``, so that nearly collinear
features (or few rows for the features) do not make ``L^{-1}`` blow up directions the training
data barely vary in; a constant feature is uncorrelated with the rest.
"""

from __future__ import annotations

import contextlib
import contextvars
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Literal

import torch
from torch import Tensor, nn

from flowkit.nn.modes import evaluating
from flowkit.nn.optimizer_steps import steps_of, total_steps
from flowkit.transforms.base import Transform
from flowkit.validation import check_bool, check_int, check_tensor


def _in_other_units(x: Tensor, samples: _Moments | None) -> bool:
    """Whether the rows ``x`` ``(N, D)`` are clearly in other units than the flow's own samples
    that the identity map gave (``samples``, their moments so far): a feature's mean more than
    ``10 s`` from theirs, or its standard deviation above ``10 s`` (or below ``0.01 s``, from 8
    rows on), with ``s`` their standard deviation but at least 1 (a shape check's few samples
    measure it poorly). Without samples of two rows or more, ``m = 0, s = 1``: the
    unit scale of a new flow's samples. The flow's own samples, however far from the origin its
    base starts (a base at a guess of (40, -25)), and copies of them, are not.
    Reads the values back."""
    x = x.detach()
    mean, std = x.mean(0), x.std(0)
    if samples is None or samples.count < 2:
        m, s = torch.zeros_like(mean), torch.ones_like(std)
    else:
        m = samples.mean.to(x)
        s = (samples.m2 / samples.count).sqrt().to(x).clamp_min(1.0)
    off = ((mean - m).abs() > 10.0 * s) | (std > 10.0 * s)
    off |= (std < 0.01 * s) & (x.shape[0] >= 8)
    return bool(off.any())


_COUNTED_WEIGHT: contextvars.ContextVar[Tensor | None] = contextvars.ContextVar(
    "flowkit_counted_weight", default=None)


@contextmanager
def counting_steps_of(weight: Tensor | None) -> Iterator[None]:
    """Within the block, a :class:`Standardize` that samples with gradients for the first time
    counts only the optimizer steps that update ``weight`` (a weight of the flow it belongs to;
    :class:`flowkit.Flow` sets it around its sampling pass) when deciding that its samples were
    trained through (see :attr:`Standardize.provisional`); without it any ``torch.optim`` step
    counts, another model's too (a shape check, a step of an unrelated model, then a
    loop of one's own kept the identity)."""
    token = _COUNTED_WEIGHT.set(weight)
    try:
        yield
    finally:
        _COUNTED_WEIGHT.reset(token)


class Standardize(Transform):
    r"""Elementwise ``z = (x - shift) / scale`` with ``log|det dz/dx| = -\sum_d \log scale_d``;
    with ``covariance="full"``, ``z = L^{-1} (x - shift) / scale`` (see the module notes).

    Args:
        features: ``D``.
        shift: ``(D,)`` finite values (default: set from data, see the module notes).
        scale: ``(D,)`` positive finite values; given together with ``shift``.
        covariance: ``"diagonal"`` (per-feature mean and standard deviation) or ``"full"``
            (also the correlations between features).
        robust: with ``covariance="diagonal"``, the median and the interquartile range
            instead of the mean and standard deviation (see the module notes).
        cholesky: with ``covariance="full"``, the ``(D, D)`` lower-triangular factor ``L``
            (positive diagonal) of the correlation of ``(x - shift) / scale``; given together
            with ``shift`` and ``scale``.

    Buffers: ``shift`` and ``scale`` ``(D,)``, ``initialized`` (a bool scalar); with
    ``covariance="full"``, ``cholesky`` ``(D, D)``.

    Example:
        >>> import torch
        >>> t = Standardize(2, shift=[1000.0, 0.0], scale=[100.0, 1.0])
        >>> z, log_det = t(torch.tensor([[1100.0, 2.0]]))
        >>> z, log_det
        (tensor([[1., 2.]]), tensor([-4.6052]))
        >>> lazy = Standardize(2)
        >>> _ = lazy(torch.tensor([[0.0, 10.0], [2.0, 30.0]]))  # training mode: first batch sets it
        >>> lazy.shift, lazy.scale
        (tensor([ 1., 20.]), tensor([ 1., 10.]))
    """

    #: The least weight ``a`` of the identity in the shrunk correlation ``(1 - a) R + a I``
    #: that a full-covariance standardization is set from; the rows' own
    #: :func:`oas_shrinkage` where it is larger (see the module notes).
    SHRINKAGE = 0.01

    def __init__(
        self,
        features: int,
        shift: Tensor | Sequence[float] | None = None,
        scale: Tensor | Sequence[float] | None = None,
        *,
        covariance: Literal["diagonal", "full"] = "diagonal",
        cholesky: Tensor | Sequence[Sequence[float]] | None = None,
        robust: bool = False,
    ):
        super().__init__()
        self.features = check_int("features", features, 1)
        if covariance not in ("diagonal", "full"):
            raise ValueError(f"'covariance' should be 'diagonal' or 'full', got {covariance!r}")
        self.covariance = covariance
        self.robust = check_bool("robust", robust)
        if self.robust and self.full:
            raise ValueError("'robust' standardization is per feature: it takes "
                             "covariance='diagonal', got covariance='full'")
        if (shift is None) != (scale is None):
            raise ValueError(
                "pass both 'shift' and 'scale' (a fixed standardization) or neither (set from "
                f"data on first use), got shift={shift!r} and scale={scale!r}"
            )
        if cholesky is not None and not self.full:
            raise ValueError("'cholesky' was given but 'covariance' is 'diagonal'")
        if self.full and (shift is None) != (cholesky is None):
            raise ValueError(
                "with covariance='full', pass 'shift', 'scale' and 'cholesky' together or none "
                f"of them, got cholesky={'None' if cholesky is None else 'a value'} and "
                f"shift={'None' if shift is None else 'a value'}"
            )
        self.register_buffer("shift", torch.zeros(self.features))
        self.register_buffer("scale", torch.ones(self.features))
        self.register_buffer("initialized", torch.tensor(False))
        self._flag: tuple[tuple[int, int], bool] | None = None  # see is_initialized
        if self.full:
            self.register_buffer("cholesky", torch.eye(self.features))
            # L^{-1}, computed in float64 whenever L is set or loaded (not saved)
            self.register_buffer("cholesky_inverse", torch.eye(self.features), persistent=False)
        self.role = "data"  # what it standardizes, for messages ("context": a flow's context)
        self._collector: _Collector | None = None
        self._provisional = False
        self._looked = False  # provisional, set by a call without gradients (see _forward)
        self._sampled_at: int | None = None  # see provisional
        if shift is not None:
            self.set(shift, scale, cholesky)

    @classmethod
    def from_data(
        cls, x: Tensor, covariance: Literal["diagonal", "full"] = "diagonal",
        robust: bool = False,
    ) -> Standardize:
        """A fixed standardization by the mean and standard deviation (and, with
        ``covariance="full"``, the correlation; with ``robust``, the median and interquartile
        range) of ``x`` ``(N, D)``, with ``x``'s dtype and device."""
        x = check_tensor("x", x, ("N", "D"))
        if x.dim() != 2 or x.shape[0] == 0:
            raise ValueError(f"'x' should have shape (N, D) with N >= 1, got {tuple(x.shape)}")
        t = cls(x.shape[1], covariance=covariance, robust=robust).to(device=x.device,
                                                                       dtype=x.dtype)
        t._set_from(t._moments(x))
        return t

    @property
    def is_initialized(self) -> bool:
        """The ``initialized`` buffer's value, read back from the device only when the buffer
        was written or replaced since the last read (its storage and version counter), so that
        the calls of a training loop on a GPU make no synchronization for it."""
        flag = self.initialized
        key = (flag.data_ptr(), flag._version)
        known = getattr(self, "_flag", None)  # absent in modules pickled by older versions
        if known is None or known[0] != key:
            known = self._flag = (key, bool(flag))
        return known[1]

    def _flag_set(self) -> None:
        """Set the ``initialized`` buffer, and note it on the host (no read back for it)."""
        with torch.no_grad():
            self.initialized.fill_(True)
        self._flag = ((self.initialized.data_ptr(), self.initialized._version), True)

    @property
    def _known_initialized(self) -> bool:
        """What the host last knew of the flag, without reading the device: what compiled
        code can branch on (True stays true until a load replaces the buffer)."""
        known = getattr(self, "_flag", None)
        return known is not None and known[1]

    @property
    def provisional(self) -> bool:
        """Whether the values were set by a call (not given, set from data or loaded), so
        that :func:`set_from_data` (and :func:`flowkit.fit`) replaces them. A value that a
        training-mode ``inverse`` with gradients used (reparameterized samples: training by
        reverse KL, or a Monte-Carlo ``entropy()`` of a new flow) stays provisional until a
        ``torch.optim`` optimizer takes a step that updates the flow's weights (inside a
        :class:`flowkit.Flow`, see :func:`counting_steps_of`; any optimizer's step for a
        ``Standardize`` used on its own): then the samples were trained through, and the value
        is the model's."""
        # (modules pickled by older versions hold a plain 'provisional' attribute)
        if not getattr(self, "_provisional", self.__dict__.get("provisional", False)):
            return False
        sampled_at = getattr(self, "_sampled_at", None)
        return sampled_at is None or self._steps() == sampled_at

    def _steps(self) -> int:
        """The optimizer steps that count for :attr:`provisional`."""
        known = getattr(self, "_watched", None)
        weight = None if known is None else known()
        return total_steps() if weight is None else steps_of(weight)

    def _settle(self) -> bool:
        """Whether the value is still provisional. One that an optimizer step has trained
        through since it was sampled with gradients (see :attr:`provisional`) is marked final
        here, the one place that does, so that later calls no longer count steps for it."""
        if self.provisional:
            return True
        if getattr(self, "_looked", False) or getattr(self, "_sampled_at", None) is not None:
            self._mark(provisional=False, looked=False,
                       single_row=getattr(self, "_single_row", False))
        return False

    def _warn_if_single_row(self, x: Tensor) -> None:
        """Warn, once, when a value set from a single row or copies of one (its shift that row,
        its scale 1) stays while a training call sees other values (``x``): calls that see one
        row at a time (a context shared by each batch, batches of one) never replace it, and an
        optimizer step fixes one that samples were drawn at (contexts near 5000 +-
        1000 kept the scale 1, a test NLL of 11.7 instead of 3.4). Copies of the row it was
        set from say nothing (a context that never varies has nothing to standardize; review
        44: the warning fired for a policy acting on one state before its first batch)."""
        if getattr(self, "_warned_single_row", False):
            return
        if self.provisional and self._steps() == getattr(self, "_single_row_at", None):
            return  # no optimizer step since: the first batch of more rows replaces it
        if not (x.detach() != self.shift.to(x.dtype)).any():  # copies of that row: no harm
            return
        self._warned_single_row = True
        role = getattr(self, "role", "data")
        warnings.warn(
            f"the standardization of the {role} (a flowkit Standardize) was set from a single "
            "row, or copies of one (shift = that row, scale = 1: one row has no spread), and "
            "training calls that see one row at a time do not replace it; set it from many "
            "rows first, "
            "flowkit.transforms.set_from_data(flow, batches) (flowkit.fit does), or pass "
            + ("one context row per data row" if role == "context" else "batches of rows"),
            stacklevel=2,
        )

    def _mark(self, provisional: bool, looked: bool, sampled: bool = False,
              single_row: bool = False) -> None:
        self._provisional, self._looked, self._sampled_at = provisional, looked, None
        self._sampled = sampled  # the identity, set by sampling before any data
        self._sample_moments: _Moments | None = None  # of the samples it gave
        self._single_row = single_row  # set from one row, or copies of one

    @property
    def full(self) -> bool:
        """Whether the correlations are divided out too (``covariance="full"``)."""
        return self.covariance == "full"

    def _moments(self, x: Tensor | None = None) -> _Moments:
        """Moments of this module's kind, of ``x`` when given."""
        moments = _Moments(self.features, self.full, self.robust)
        if x is not None:
            try:
                moments.add(x)
            except RuntimeError as e:  # torch.func.vmap cannot read values back
                raise RuntimeError(
                    "a Standardize is set from the first batch a new flow sees in training "
                    "mode, which reads its values: this call cannot (inside torch.func.vmap, "
                    "for example). Set it first: one call outside the transform, flowkit.fit, "
                    "or flowkit.transforms.set_from_data; or use the flow in eval mode"
                ) from e
        return moments

    def _set_from(self, moments: _Moments) -> None:
        self.set(*moments.values(self.shift.dtype))

    def set(
        self,
        shift: Tensor | Sequence[float],
        scale: Tensor | Sequence[float],
        cholesky: Tensor | Sequence[Sequence[float]] | None = None,
    ) -> None:
        """Fix ``shift`` and ``scale`` (each ``(D,)``; ``scale`` positive and finite), with
        ``covariance="full"`` also ``cholesky`` (``(D, D)`` lower triangular with a positive
        diagonal), and mark the transform initialised (not provisional). Values are copied
        into the buffers (their dtype and device).

        Raises:
            ValueError: a shape other than ``(D,)`` (``(D, D)``), a non-finite ``shift``, a
                non-finite or non-positive ``scale``; a ``cholesky`` missing, given to a
                diagonal standardization, not lower triangular or without a positive finite
                diagonal.
        """
        values = {}
        for name, value in (("shift", shift), ("scale", scale)):
            given = torch.as_tensor(value, dtype=torch.float64, device="cpu")
            if given.shape != (self.features,):
                raise ValueError(
                    f"'{name}' should have shape ({self.features},), got {tuple(given.shape)}"
                )
            values[name] = given
        if (cholesky is not None) != self.full:
            raise ValueError(
                "'cholesky' should be given with covariance='full' and only then; this "
                f"Standardize has covariance={self.covariance!r}"
            )
        if cholesky is not None:
            values["cholesky"] = _checked_cholesky(cholesky, self.features)
        if not torch.isfinite(values["shift"]).all():
            raise ValueError(f"'shift' should be finite, got {values['shift'].tolist()}")
        bad = ~(torch.isfinite(values["scale"]) & (values["scale"] > 0))
        if bad.any():
            raise ValueError(
                "'scale' should be positive and finite, got "
                f"{values['scale'].tolist()} (bad at features {bad.nonzero().flatten().tolist()})"
            )
        if not (values["scale"].to(self.scale.dtype) > 0).all():
            raise ValueError(
                f"'scale' {values['scale'].tolist()} underflows to zero in {self.scale.dtype}"
            )
        with torch.no_grad():
            self.shift.copy_(values["shift"])
            self.scale.copy_(values["scale"])
            if self.full:
                self.cholesky.copy_(values["cholesky"])
                self._invert_cholesky()
        self._flag_set()
        self._mark(provisional=False, looked=False)

    def _invert_cholesky(self) -> None:
        identity = torch.eye(self.features, dtype=torch.float64)
        inverse = torch.linalg.solve_triangular(
            self.cholesky.detach().to("cpu", torch.float64), identity, upper=False
        )
        with torch.no_grad():
            self.cholesky_inverse.copy_(inverse)

    def _apply(self, fn, *args, **kwargs):  # type: ignore[no-untyped-def]
        # .to(dtype) / .double(): the inverse is recomputed from the converted factor, so that
        # the two stay inverse to the new precision
        result = super()._apply(fn, *args, **kwargs)
        if self.full and self.cholesky.is_floating_point() and not self.cholesky.is_meta:
            self._invert_cholesky()
        return result

    def __getstate__(self) -> dict:
        """Pickling and deepcopy: step counts do not carry over (the copy watches no weight,
        and another process counts afresh), so a value that samples were trained through is
        stored as final, and one still provisional as not yet sampled with gradients."""
        state = self.__dict__.copy()
        state.pop("_watched", None)
        if state.get("_sampled_at") is not None:
            if self.provisional:
                state["_sampled_at"] = None
            else:
                state["_provisional"], state["_looked"], state["_sampled_at"] = False, False, None
        return state

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        self.__dict__.setdefault("robust", False)  # pickled before the option
        if "_flag" not in self.__dict__:  # pickled by a version that did not note the flag
            self.is_initialized  # noqa: B018  (read once now: compiled code branches on it)

    def _load_from_state_dict(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super()._load_from_state_dict(*args, **kwargs)
        if self.full:
            self._invert_cholesky()
        self.is_initialized  # noqa: B018  (read once now: compiled code branches on it)
        self._mark(provisional=False, looked=False)  # a loaded value is the model's

    def _see(self, x: Tensor) -> None:
        """Data-dependent initialisation: the part of ``forward`` that reads the data."""
        if self._collector is not None:
            self._collector.add(self, x.detach())
        elif self.training:
            moments = self._moments(x.detach())
            self._set_from(moments)
            one_row = bool((moments.m2 == 0).all())  # one row, or copies of one row
            sampling = getattr(self, "_sampling", False)
            look = not torch.is_grad_enabled() or one_row or sampling
            self._mark(provisional=True, looked=look, single_row=one_row)
            if sampling:  # contexts sampled at: trained through once an optimizer steps
                self._count_steps_from_now()
            self._single_row_at = self._steps() if one_row else None

    @contextmanager
    def _sampling_pass(self) -> Iterator[None]:
        """Calls inside are a flow's sampling pass: a value they set (from the contexts
        sampled at) is a look, which the first training batch replaces, as a look without
        gradients is (an ``entropy()`` at 3 contexts set the context scale for a
        loop of one's own)."""
        before = getattr(self, "_sampling", False)
        self._sampling = True
        try:
            yield
        finally:
            self._sampling = before

    def _looks(self, x: Tensor, compiled: bool = False) -> bool:
        """Whether this call sets the values from ``x``. A value set by a look (sampling, a
        no_grad peek, reparameterized samples before any optimizer step), or from a single row
        (no spread to measure: a check of one point, a Monte-Carlo look at one context), gives
        way to the first training-mode call with gradients on more rows: the first step of a
        hand-written training loop (see the module notes for the identity that sampling set).
        In eval mode only a collector looks, and the flag is not read back from the device.
        ``compiled`` code branches on what the host knows (Python values only), and the call
        it then makes outside the graph decides the rest."""
        if self._collector is not None:
            return True
        if not self.training:
            return False
        if not compiled and torch.is_grad_enabled() and getattr(self, "_single_row", False):
            one_row = x.shape[0] == 1 or not (x.detach() != x[:1].detach()).any()
            if one_row or not self.provisional:  # the value stays
                self._warn_if_single_row(x)
            if one_row:
                return False
        may_look = self._looked and torch.is_grad_enabled() and x.shape[0] > 1
        if compiled:
            return not self._known_initialized or may_look
        if not self.is_initialized:
            return True
        if not may_look:
            return False
        if not self._settle():  # final: an optimizer stepped after the samples it gave
            return False
        # an identity set by sampling and then sampled with gradients gives way only to data
        # clearly in other units: the flow's own samples keep it (log_prob of the x of
        # rsample_and_log_prob agrees with it)
        if getattr(self, "_sampled", False) and self._sampled_at is not None:
            return _in_other_units(x, getattr(self, "_sample_moments", None))
        return True

    @torch.compiler.disable
    def _see_outside_the_graph(self, x: Tensor) -> None:
        """:meth:`_see` called from compiled code when the host does not know the values set:
        run eagerly (a graph break) so that a flow compiled before training is standardized
        as an eager one would be (compiled code skipped it, 88.5 nats off)."""
        if self._looks(x):
            self._see(x)

    def _values(self) -> dict[str, Tensor]:
        """The buffers a call computes with: copies while a later call may still replace them
        in place (a look, gradients on), so that the graph of this call stays valid (review
        30: an rsample and a first data batch in one loss failed in backward)."""
        names = ("shift", "scale", "cholesky", "cholesky_inverse") if self.full else (
            "shift", "scale")
        copy = self._looked and torch.is_grad_enabled()
        return {n: getattr(self, n).clone() if copy else getattr(self, n) for n in names}

    def _forward(self, x: Tensor, context: Tensor | None) -> tuple[Tensor, Tensor]:
        if torch.compiler.is_compiling():  # a graph break only while the host knows no values
            if self._looks(x, compiled=True):
                self._see_outside_the_graph(x)
        elif self._looks(x):
            self._see(x)
        v = self._values()
        z = (x - v["shift"]) / v["scale"]
        if self.full:
            z = z @ v["cholesky_inverse"].T
        return z, self._log_det(x, -1.0, v)

    def _sample_bookkeeping(self, z: Tensor) -> None:
        """What a training-mode ``inverse`` of ``z`` notes: the identity when no value is set,
        the moments of all the samples that identity gives until an optimizer step fixes it
        (what data must differ from to replace it: :func:`_in_other_units`), and the optimizer
        step count at the first call with gradients (see the module notes)."""
        if not self.is_initialized:
            self._flag_set()  # the identity
            self._mark(provisional=True, looked=True, sampled=True)
        if getattr(self, "_sampled", False) and self.provisional:  # every draw, one row too
            if getattr(self, "_sample_moments", None) is None:
                self._sample_moments = _Moments(self.features)
            with contextlib.suppress(ValueError):  # non-finite samples: not counted
                self._sample_moments.add(z.detach())
        self._count_steps_from_now()

    def _count_steps_from_now(self) -> None:
        """Samples to train through (reverse KL) with gradients: once an optimizer steps,
        neither data nor a later call replace the value (see :attr:`provisional`)."""
        if torch.is_grad_enabled() and self._settle() and self._sampled_at is None:
            weight = _COUNTED_WEIGHT.get()
            self._watched = None if weight is None else weakref.ref(weight)
            self._sampled_at = self._steps()

    _sample_bookkeeping_outside_the_graph = torch.compiler.disable(_sample_bookkeeping)

    def _inverse(self, z: Tensor, context: Tensor | None) -> tuple[Tensor, Tensor]:
        if self.training and self._collector is None:
            if not torch.compiler.is_compiling():
                self._sample_bookkeeping(z)
            elif not self._known_initialized or (
                torch.is_grad_enabled() and getattr(self, "_provisional", False)
                and self._sampled_at is None
            ):  # a graph break while the host knows no values, or no step count for them
                self._sample_bookkeeping_outside_the_graph(z)
        v = self._values()
        if self.full:
            z = z @ v["cholesky"].T
        return z * v["scale"] + v["shift"], self._log_det(z, 1.0, v)

    def _log_det(self, like: Tensor, sign: float, v: dict[str, Tensor]) -> Tensor:
        log_scale = torch.log(v["scale"]).sum()
        if self.full:
            log_scale = log_scale + torch.log(torch.diagonal(v["cholesky"])).sum()
        return (sign * log_scale).expand(like.shape[0])

    def extra_repr(self) -> str:
        text = f"features={self.features}" + (", covariance='full'" if self.full else "") + (
            ", robust=True" if self.robust else "")
        if not self.is_initialized:
            return text + ", uninitialized"
        return text + (", provisional" if self.provisional else "")


def _checked_cholesky(value: Tensor | Sequence[Sequence[float]], features: int) -> Tensor:
    """``value`` as a float64 CPU tensor, checked to be a ``(D, D)`` lower-triangular matrix
    with a positive finite diagonal (a Cholesky factor)."""
    given = torch.as_tensor(value, dtype=torch.float64, device="cpu")
    if given.shape != (features, features):
        raise ValueError(
            f"'cholesky' should have shape ({features}, {features}), got {tuple(given.shape)}"
        )
    if not torch.isfinite(given).all():
        raise ValueError("'cholesky' should be finite")
    if (torch.triu(given, diagonal=1) != 0).any():
        raise ValueError("'cholesky' should be lower triangular (zeros above the diagonal)")
    diagonal = torch.diagonal(given)
    if not (diagonal > 0).all():
        raise ValueError(
            f"'cholesky' should have a positive diagonal, got {diagonal.tolist()}"
        )
    return given


IQR_OF_NORMAL = 1.3489795003921634
"""The interquartile range of the standard normal distribution, ``2 * Phi^{-1}(0.75)``."""

ROBUST_ELEMENTS = 2**23
"""Values (rows times features, 64 MiB of float64) a robust :class:`Standardize` keeps to take
its quartiles from; past them, every ``k``-th row seen (``k`` a power of 2)."""


class _Moments:
    """Count, mean and sum of squared deviations per feature (with ``full``, the matrix of
    summed products of deviations), in float64, merged batch by batch (Chan, Golub and LeVeque
    1979), so that data far from zero loses no precision; with ``robust``, also the rows (up
    to :data:`ROBUST_ELEMENTS`, :meth:`_keep`) for the quartiles."""

    def __init__(self, features: int, full: bool = False, robust: bool = False):
        self.count = 0
        self.full = full
        self.rows: list[Tensor] | None = [] if robust else None
        self.indices: list[Tensor] = []  # of the kept rows, in the order seen
        self.kept = 0
        self.stride = 1  # every stride-th row seen is kept
        self.mean = torch.zeros(features, dtype=torch.float64)
        shape = (features, features) if full else (features,)
        self.m2 = torch.zeros(shape, dtype=torch.float64)

    def add(self, x: Tensor) -> None:
        if x.shape[0] == 0:
            return
        x = x.to(device="cpu", dtype=torch.float64)
        if not torch.isfinite(x).all():
            raise ValueError(
                "'x' contains NaN or Inf values: a Standardize cannot be set from them"
            )
        n, mean = x.shape[0], x.mean(0)
        if self.rows is not None:
            self._keep(x)
        centred = x - mean
        m2 = centred.T @ centred if self.full else (centred**2).sum(0)
        total = self.count + n
        delta = mean - self.mean
        spread = torch.outer(delta, delta) if self.full else delta**2
        self.mean = self.mean + delta * (n / total)
        self.m2 = self.m2 + m2 + spread * (self.count * n / total)
        self.count = total

    def _keep(self, x: Tensor) -> None:
        """Keep the rows of ``x`` (the rows ``count, count + 1, ...`` seen) for the quartiles:
        every ``stride``-th row seen, the stride doubled (and the rows kept thinned to it, in
        one block) whenever more than :data:`ROBUST_ELEMENTS` values would be kept: an even
        sample of all the rows, in whatever order they come."""
        assert self.rows is not None
        index = torch.arange(self.count, self.count + x.shape[0])
        keep = index % self.stride == 0
        if not keep.any():
            return
        self.rows.append(x[keep])
        self.indices.append(index[keep])
        self.kept += int(keep.sum())
        limit = max(1, ROBUST_ELEMENTS // x.shape[1])
        if self.kept <= limit:
            return
        rows, indices = torch.cat(self.rows), torch.cat(self.indices)
        while len(indices) > limit:
            self.stride *= 2
            thinned = indices % self.stride == 0
            rows, indices = rows[thinned], indices[thinned]
        self.rows, self.indices, self.kept = [rows], [indices], len(indices)

    def _robust(self, mean: Tensor, std: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """Median and interquartile range / 1.349 of the kept rows, the mean and ``std``
        where the range is zero or below ``dtype``'s resolution at the median."""
        assert self.rows is not None
        rows = torch.cat(self.rows)
        quartiles = torch.quantile(rows, torch.tensor([0.25, 0.5, 0.75], dtype=rows.dtype),
                                   dim=0)
        median, spread = quartiles[1], (quartiles[2] - quartiles[0]) / IQR_OF_NORMAL
        narrow = spread <= torch.finfo(dtype).eps * median.abs()
        return torch.where(narrow, mean, median), torch.where(narrow, std, spread)

    def values(self, dtype: torch.dtype) -> tuple[Tensor, Tensor] | tuple[Tensor, Tensor, Tensor]:
        """Mean and standard deviation, 1 where the deviation is zero or below ``dtype``'s
        resolution at the mean (a constant feature); with ``full``, also the Cholesky factor of
        the shrunk correlation (see the module notes), in which a constant feature is
        uncorrelated with the others."""
        if self.count == 0:
            raise ValueError("a Standardize cannot be set from an empty batch")
        variance = torch.diagonal(self.m2) if self.full else self.m2
        std = (variance / self.count).sqrt()
        if self.rows is not None:
            shift, spread = self._robust(self.mean, std, dtype)
            constant = (spread <= torch.finfo(dtype).eps * shift.abs()) | (spread == 0)
            return shift, torch.where(constant, torch.ones_like(spread), spread)
        constant = std <= torch.finfo(dtype).eps * self.mean.abs()
        constant |= std == 0
        scale = torch.where(constant, torch.ones_like(std), std)
        if not self.full:
            return self.mean, scale
        varying = (~constant).double()
        correlation = self.m2 / self.count / torch.outer(scale, scale)
        correlation = correlation * torch.outer(varying, varying)
        correlation.fill_diagonal_(1.0)
        a = max(Standardize.SHRINKAGE, oas_shrinkage(correlation, self.count))
        shrunk = (1.0 - a) * correlation + a * torch.eye(len(std), dtype=torch.float64)
        return self.mean, scale, torch.linalg.cholesky(shrunk)


def oas_shrinkage(correlation: Tensor, rows: int) -> float:
    r"""The oracle approximating shrinkage (Chen, Wiesel, Eldar and Hero 2010) of a ``(D, D)``
    correlation matrix ``R`` estimated from ``rows`` rows towards the identity: with
    :math:`\alpha = \frac{1}{D^2} \sum_{ij} R_{ij}^2`,
    :math:`a = \min\big(1, \frac{\alpha + 1}{(n + 1)(\alpha - 1/D)}\big)` (1 for
    :math:`R = I`). It shrinks much where the rows are few for the features (80 rows of 30
    correlated features: 0.095) and little where they are many (1000 rows of 5: 0.007)."""
    alpha = float(correlation.square().mean())
    denominator = (rows + 1.0) * (alpha - 1.0 / correlation.shape[0])
    return 1.0 if denominator <= 0 else min(1.0, (alpha + 1.0) / denominator)


def standardizations_to_set(model: nn.Module) -> list[Standardize]:
    """The :class:`Standardize` modules of ``model`` that data should set: not initialised, or
    set provisionally by a call."""
    return [m for m in model.modules()
            if isinstance(m, Standardize) and (m.provisional or not m.is_initialized)]


class SingleRowWarning(UserWarning):
    """:func:`set_from_data` saw a single row: the shift is that row and the scale is 1. (A
    category of its own, so that callers that warned of it in their own terms can filter it.)"""


def set_from_data(
    model: nn.Module,
    batches: Iterable[Sequence[Tensor]],
    call: Callable[..., object] | None = None,
) -> list[Standardize]:
    """Set every :class:`Standardize` of ``model`` that is not initialised, or only
    provisionally (see the module notes), from many batches at once.

    ``call(*batch)`` (default ``model.log_prob``) runs for each batch, in evaluation mode and
    without gradients; meanwhile the modules record their inputs' per-feature count, mean and
    squared deviations (merged in float64), and after the pass the first module the data
    reached is set to the mean and standard deviation of all it saw. Then another pass sets
    the next, and so on (one pass per module: the builders' flows have two, on the data and
    on the context), so that a module behind another one, as in two flows' transforms stacked
    in one :class:`~flowkit.transforms.Compose`, sees the data standardised by it. A call
    stops as soon as every module being set has seen its batch (the layers behind are not
    run), so a pass costs little more than reading the data. ``batches`` is read into a list
    first (it is iterated once per module).

    Args:
        model: any module holding :class:`Standardize` modules (e.g. a :class:`flowkit.Flow`).
        batches: e.g. ``[(x_chunk, context_chunk), ...]`` or ``[(x_chunk,), ...]``.
        call: what runs a batch through the model.

    Returns:
        The modules that were set (those that saw no data stay as they were).

    Warns:
        SingleRowWarning: a module saw a single row: its shift is that row and its scale 1.

    Example:
        >>> import torch, flowkit
        >>> flow = flowkit.MAF(2, layers=2, hidden_features=(8,))
        >>> x = torch.randn(1000, 2) * 100.0 + 1000.0
        >>> done = set_from_data(flow, [(chunk,) for chunk in x.split(256)])
        >>> len(done), bool(torch.allclose(done[0].shift, x.mean(0)))
        (1, True)
    """
    if not isinstance(model, nn.Module):
        raise TypeError(
            f"'model' should be a torch.nn.Module (a flowkit.Flow, say), got "
            f"{type(model).__name__}")
    if isinstance(batches, Tensor) or not isinstance(batches, Iterable):
        raise TypeError(
            "'batches' should be an iterable of batches, each a tuple of the call's arguments, "
            f"e.g. [(x_chunk,), ...] or [(x_chunk, context_chunk), ...], got "
            f"{type(batches).__name__}"
        )
    batches = list(batches)  # one pass per module (see above)
    for i, batch in enumerate(batches):
        if not isinstance(batch, (tuple, list)):
            raise TypeError(
                f"'batches[{i}]' should be a tuple of the call's arguments, e.g. (x_chunk,), "
                f"got {type(batch).__name__}"
            )
    pending = standardizations_to_set(model)
    if not pending:
        return []
    call = model.log_prob if call is None else call
    done: list[Standardize] = []
    single_row = False  # warned once per call, not once per module (data and context)
    with evaluating(model):
        while pending:
            collector = _Collector(pending)
            try:
                for batch in batches:
                    collector.seen.clear()
                    try:
                        call(*batch)
                    except _AllSeen:
                        pass
            finally:
                for m in pending:
                    m._collector = None
            first = collector.first
            if first is None:  # no module saw data
                break
            single_row |= collector.moments[first].count == 1
            first._set_from(collector.moments[first])
            done.append(first)
            pending = [m for m in pending if m is not first]
    if single_row:
        warnings.warn("'batches' hold a single row: it sets the shift, and the scale is 1 (one "
                      "row has no spread to measure); pass more rows", SingleRowWarning,
                      stacklevel=2)
    return done


class _AllSeen(Exception):
    """Every module being set has seen the current batch: the rest of the pass is skipped."""


class _Collector:
    """The moments recorded by the modules that :func:`set_from_data` is setting."""

    def __init__(self, modules: list[Standardize]):
        self.moments = {m: m._moments() for m in modules}
        self.seen: set[Standardize] = set()
        self.first: Standardize | None = None  # the first to see data: the one set this pass
        for m in modules:
            m._collector = self

    def add(self, module: Standardize, x: Tensor) -> None:
        self.moments[module].add(x)
        self.seen.add(module)
        if self.first is None:
            self.first = module
        if len(self.seen) == len(self.moments):
            raise _AllSeen
