"""One colour and marker per method across every figure (calibrl.evaluation.styles)."""

from __future__ import annotations

from matplotlib.colors import to_hex

from calibrl.evaluation import plots
from calibrl.evaluation.styles import SELECTION_NAMES, series_style


def test_a_method_has_one_style_whatever_its_label_or_position():
    grpo = series_style("GRPO", 0)
    assert series_style("GRPO", 5) == grpo
    assert series_style("grpo_step400", 3).color == grpo.color  # an input file named after the method
    assert series_style("CAPO (tau 0.6)").color == series_style("CAPO").color


def test_methods_that_contain_each_others_names_stay_apart():
    colors = {label: series_style(label).color for label in (
        "GRPO", "SEED-GRPO", "Dr.GRPO (GRPO x reward std)", "GRPO + frozen mask", "CAPO (tau 0.6)",
        "CAPO + mask (tau 0.6)", "CAPO + frozen mask (tau 0.6)", "GCPO", "GRPO + decision CE (lambda 1)", "SFT (warm start)", "RLCR")}
    assert len(set(colors.values())) == len(colors), colors


def test_a_variant_keeps_its_methods_marker_in_a_shade_of_its_own():
    base, variant = series_style("CAPO (tau 0.6)"), series_style("CAPO (tau 0.2)")
    assert variant.marker == base.marker and variant.color != base.color
    assert series_style("CAPO (tau 0.2)", 4) == variant  # the same shade in every figure


def test_labels_naming_no_method_get_colours_no_method_uses():
    method_colors = {series_style(m).color for m in ("GRPO", "CAPO", "GCPO", "SEED-GRPO", "CAPO + mask")}
    files = [series_style(name, i).color for i, name in enumerate(("run_a", "run_b", "run_c"))]
    assert len(set(files)) == 3 and not set(files) & method_colors


def test_figures_draw_each_method_in_its_colour_whatever_the_order(tmp_path, monkeypatch):
    drawn = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: drawn.append(fig) or path)
    records = {m: [{"step": 0, "auroc": 0.8 + lift, "accuracy": 0.3}, {"step": 10, "auroc": 0.7 + lift, "accuracy": 0.5}]
               for m, lift in (("GRPO", 0.0), ("CAPO (tau 0.6)", 0.05))}  # apart: neither curve lies on the other
    for order in (("GRPO", "CAPO (tau 0.6)"), ("CAPO (tau 0.6)", "GRPO")):
        plots.plot_training_curves({m: records[m] for m in order}, ("auroc",), tmp_path / "c.png")
        plots.plot_metric_paths({m: records[m] for m in order}, x="accuracy", y="auroc", path=tmp_path / "p.png")
    for fig in drawn:
        by_label = {line.get_label(): to_hex(line.get_color()) for line in fig.axes[0].get_lines()}
        assert by_label["GRPO"] == series_style("GRPO").color
        assert by_label["CAPO (tau 0.6)"] == series_style("CAPO (tau 0.6)").color


def test_scaling_legend_names_methods_in_words(tmp_path, monkeypatch):
    drawn = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: drawn.append(fig) or path)
    curve = {"ns": [1, 2, 4], "accuracy": [0.5, 0.55, 0.6], "std": [0, 0.01, 0.0]}
    plots.plot_scaling_curves({"pc": curve, "best_of_n": curve}, tmp_path / "s.png")
    labels = {line.get_label() for line in drawn[0].axes[0].get_lines()}
    assert {SELECTION_NAMES["pc"], SELECTION_NAMES["best_of_n"]} <= labels and "pc" not in labels
