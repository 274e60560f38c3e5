"""One colour and marker per method across every figure of the project, and readable names for metric and
selection-method keys.

:func:`series_style` gives a series its colour, marker and line style from its label: a label naming a known
method ("GRPO", "CAPO (tau 0.6)", "CAPO + frozen mask (tau 0.6)", "SEED-GRPO", a file called ``grpo_step400``)
gets that method's style in every figure; a variant in parentheses ("tau 0.2", "lambda 0.01") keeps the
method's marker and hue in a shade of its own; any other label (an input file's name) gets a colour by its
position that no method uses. Figures draw through it, so GRPO is the same blue in the demo, the results and
an eval report.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

__all__ = ["SELECTION_NAMES", "SeriesStyle", "series_style"]


@dataclass(frozen=True)
class SeriesStyle:
    color: str
    marker: str
    linestyle: str

    def kwargs(self) -> dict[str, str]:
        return {"color": self.color, "marker": self.marker, "linestyle": self.linestyle}


# (test on the lower-cased label with "_" and "-" read as spaces, colour, marker, line style): the first match
# wins, so the specific names come before the names they contain (SEED-GRPO before GRPO, CAPO + mask before CAPO)
_METHODS: tuple[tuple[str, str, str, str], ...] = (
    (r"warm start|\bsft\b|untrained|\bstart\b", "#404040", "*", ":"),
    (r"\bseed grpo\b", "#bcbd22", "P", "-."),
    (r"\bdr\.? ?grpo\b", "#8c564b", "d", "--"),
    (r"\bgcpo\b", "#2ca02c", "^", "--"),
    (r"\brlcr\b", "#e377c2", "h", "-"),
    (r"decision", "#9467bd", "X", "-"),
    (r"\bcapo\b.*frozen mask", "#e7969c", "d", "--"),  # the paper's frozen reading beside the per-batch one
    (r"\bcapo\b.*mask", "#d62728", "D", "-."),
    (r"\bcapo\b", "#ff7f0e", "s", "-"),
    (r"\bcodapo\b", "#17becf", "<", "--"),
    (r"\bcde\b", "#7f7f7f", ">", "--"),
    (r"\bsimko\b", "#aec7e8", "p", "--"),
    (r"\bgspo\b", "#98df8a", "H", "--"),
    (r"\brloo\b", "#c5b0d5", "8", "--"),
    (r"\bgrpo\b.*mask", "#17becf", "v", "-."),
    (r"\bgrpo\b.*\bkl\b", "#393b79", "<", "--"),
    (r"\bgrpo\b.*(lr 3e 5|slower)", "#6baed6", ">", ":"),
    (r"\bgrpo\b", "#1f77b4", "o", "-"),
)
# labels that name no method (input files): colours and markers no method above uses
_OTHERS = ("#000000", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd", "#e6550d", "#31a354")
_OTHER_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
_OTHER_STYLES = ("-", "--", "-.", ":")
_VARIANT_SHADES = (0.5, 0.7, 1.25, 1.45, 0.85)  # <1 darker, >1 lighter than the method's colour

SELECTION_NAMES = {
    "majority": "majority vote",
    "weighted": "probability-weighted vote",
    "pc": "Perplexity Consistency",
    "rpc": "RPC (pruning + PC)",
    "best_of_n": "best-of-N (highest confidence)",
    "confidence_weighted": "confidence-weighted vote",
    "weighted_verbalized": "vote weighted by stated confidence",
    "deepconf_mean": "DeepConf: vote weighted by mean token confidence",
    "deepconf_tail": "DeepConf: vote weighted by tail confidence",
    "deepconf_bottom10": "DeepConf: vote weighted by bottom-10% window confidence",
    "deepconf_min": "DeepConf: vote weighted by lowest window confidence",
    "deepconf_tail_top10": "DeepConf: top 10% by tail confidence, weighted vote",
    "deepconf_bottom10_top10": "DeepConf: top 10% by bottom-10% confidence, weighted vote",
    "deepconf_tail_top90": "DeepConf: top 90% by tail confidence, weighted vote",
    "deepconf_bottom10_top90": "DeepConf: top 90% by bottom-10% confidence, weighted vote",
    "deepconf_online": "DeepConf online (early-stopped sampling, its vote)",
}
_SELECTION_STYLES = {
    "majority": ("#1f77b4", "o", "-"), "weighted": ("#ff7f0e", "s", "--"), "pc": ("#2ca02c", "^", "-."),
    "rpc": ("#d62728", "D", ":"), "best_of_n": ("#9467bd", "v", "-"), "confidence_weighted": ("#8c564b", "P", "--"),
    "weighted_verbalized": ("#e377c2", "X", "-."),
    "deepconf_mean": ("#7f7f7f", "o", ":"), "deepconf_tail": ("#bcbd22", "s", ":"),
    "deepconf_bottom10": ("#17becf", "^", ":"), "deepconf_min": ("#393b79", "v", ":"),
    "deepconf_tail_top10": ("#8c6d31", "D", "-"), "deepconf_bottom10_top10": ("#637939", "P", "-"),
    "deepconf_tail_top90": ("#843c39", "X", "--"), "deepconf_bottom10_top90": ("#7b4173", "*", "--"),
    "deepconf_online": ("#000000", "h", "-"),
}


def _shade(color: str, factor: float) -> str:
    """``color`` darkened (factor < 1) or mixed toward white (factor > 1)."""
    from matplotlib.colors import to_hex, to_rgb

    rgb = to_rgb(color)
    if factor <= 1:
        return to_hex(tuple(c * factor for c in rgb))
    return to_hex(tuple(c + (1 - c) * (factor - 1) for c in rgb))


def _variant(label: str) -> str:
    """The parenthesised variant of a label ("tau 0.2"), without the reference settings every arm shares."""
    inner = " ".join(re.findall(r"\(([^)]*)\)", label)).lower()
    return re.sub(r"\btau 0\.6\b|\blr 1e-4\b|\bwarm start\b|\bsft\b|,", " ", inner).strip()


def series_style(label: str, index: int = 0) -> SeriesStyle:
    """The colour, marker and line style of the series ``label`` (``index``: its position in the figure, used
    only for labels that name no method)."""
    if label in _SELECTION_STYLES:
        return SeriesStyle(*_SELECTION_STYLES[label])
    text = re.sub(r"[_\-]+", " ", label.lower())
    for pattern, color, marker, style in _METHODS:
        if re.search(pattern, text):
            variant = _variant(label)
            if variant:  # a shade and line style of its own, the same for the same variant in every figure
                h = int(hashlib.sha1(variant.encode()).hexdigest(), 16)
                color = _shade(color, _VARIANT_SHADES[h % len(_VARIANT_SHADES)])
                style = _OTHER_STYLES[(h // 7) % len(_OTHER_STYLES)]
            return SeriesStyle(color, marker, style)
    return SeriesStyle(_OTHERS[index % len(_OTHERS)], _OTHER_MARKERS[index % len(_OTHER_MARKERS)],
                       _OTHER_STYLES[index % len(_OTHER_STYLES)])
