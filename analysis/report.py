"""One Markdown page: the figures, the cost model, and the seed claims C1-C8 checked.

    python -m analysis.report results/ -o report/       # report/README.md + report/figures/

The page holds every figure ``analysis.plot`` can draw from the results (and
says which it skipped), the fitted cost model with its prediction errors and
its extrapolation (when microbenchmark records are present), and a table of
the seed claims (shared/DESIGN.md §1): what was measured here, what the model
predicts at the claim's scale, and a verdict with its reason.
"""

from __future__ import annotations

import sys
from pathlib import Path

from analysis.cli import UsageError, parser, run, warn
from analysis.load import load

PROG = "analysis.report"


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def build(records: list[dict], out: Path, native_is: dict[str, str] | None = None,
          sources: list[str] | None = None) -> Path:
    from analysis import model as cost
    from analysis.claims import check_all
    from analysis.figures import FIGURES, save
    from analysis.plot import build as build_figures

    figdir = out / "figures"
    figdir.mkdir(parents=True, exist_ok=True)
    cost.mark_native(records, native_is)
    drawn, skipped = build_figures(records)
    lines = ["# commbench report", ""]
    if sources:
        lines += [f"Results: {', '.join(f'`{s}`' for s in sources)} "
                  f"({len(records)} records).", ""]
    lines += ["## Figures", ""]
    for name, fig in drawn.items():
        save(fig, figdir / name)
        lines += [f"### {FIGURES[name][0]}", "", f"![{name}](figures/{name}.png)", ""]
    if skipped:
        lines += ["Skipped for lack of data:", ""]
        lines += [f"- `{k}`: {v}" for k, v in skipped.items()] + [""]

    lines += ["## Cost model", ""]
    res = None
    try:
        res = cost.analyse(records, native_is)
    except cost.ModelError as e:
        lines += [f"Not fitted: {e}. The claims below use the model with its stated "
                  "A100-class defaults only.", ""]
    if res is not None:
        save(cost.fit_figure(res.points, res.fit_points, res.params), figdir / "model_fit")
        lines += ["Fitted by `python -m analysis.model` (see its docstring for the formulas, "
                  "Thakur, Rabenseifner & Gropp 2005).", "", "```",
                  *cost.report_lines(res), "```", "", "![model_fit](figures/model_fit.png)", ""]
    sc = res.scenario if res is not None else cost.Scenario()
    save(cost.extrapolation_figure(sc), figdir / "model_extrapolation")
    lines += [f"Extrapolation: ResNet-50 ({sc.grad_bytes / 1e6:.1f} MB float32 gradient), "
              f"{sc.compute_s * 1e3:.1f} ms compute per step (batch "
              f"{cost.A100_RESNET50_BATCH} on one A100 80GB at {cost.A100_RESNET50_IMG_S:g} "
              "img/s, mixed precision: NVIDIA DeepLearningExamples, PyTorch ResNet50 v1.5 "
              f"README), 8 GPUs per node on NVLink, {sc.alpha_inter * 1e6:g} µs per inter-node "
              "message (stated, RDMA-class), link bandwidth = line rate, no overlap of sync and "
              "compute.", "",
              "![model_extrapolation](figures/model_extrapolation.png)", ""]

    lines += ["## Seed claims", "",
              "| # | claim | measured here | model at the claim's scale | verdict | reason |",
              "|---|---|---|---|---|---|"]
    for c in check_all(records, res):
        fig = f" ([figure](figures/{c.figure}.png))" if c.figure in drawn else ""
        lines.append(f"| {c.id} | {_cell(c.text)} | {_cell(c.measured)}{fig} | "
                     f"{_cell(c.model)} | **{c.verdict}** | {_cell(c.reason)} |")
    lines.append("")
    page = out / "README.md"
    page.write_text("\n".join(lines), encoding="utf-8")
    return page


def body(argv: list[str]) -> int:
    from analysis.model import parse_native_is

    p = parser(PROG, "Write a Markdown report: figures, cost model and the seed claims C1-C8.")
    p.add_argument("paths", nargs="+", help="result files or directories")
    p.add_argument("-o", "--output", default="report", help="directory for README.md + figures")
    p.add_argument("--native-is", action="append", metavar="ALGO=PATH",
                   help="as for analysis.model: native records in PATH ran ALGO")
    args = p.parse_args(argv)
    out = Path(args.output)
    if out.exists() and not out.is_dir():
        raise UsageError(f"-o/--output: {out} is not a directory")
    native_is = parse_native_is(args.native_is)
    loaded = load(args.paths)
    warn(PROG, loaded.warnings)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"-o/--output: cannot create {out}: {e.strerror}") from None
    page = build(loaded.records, out, native_is, [str(x) for x in args.paths])
    print(f"wrote {page}")
    return 0


def main(argv: list[str] | None = None) -> int:
    return run(PROG, body, argv)


if __name__ == "__main__":
    sys.exit(main())
