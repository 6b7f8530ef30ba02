"""control-node report: jitter report (terminal, PNG plots, HTML, .hgrm, JSON) of one or more run dirs."""


def register(sub):
    r = sub.add_parser(
        "report", help="jitter report of run dirs: percentiles, misses, RT features, plots, HTML; compare runs",
        description="Report a node run dir (runs/<id>/), a simulator run dir, or a launch dir holding node/ and "
                    "sim/. Prints a summary, writes PNG plots, a self-contained report.html, report.json and "
                    "HdrHistogram .hgrm percentile files. With two or more run dirs: a side-by-side comparison "
                    "with ratios (later run / first run). See docs/reports.md.")
    r.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run dir(s) to report")
    r.add_argument("--out", metavar="DIR",
                   help="output dir (default: RUN_DIR/report/, or FIRST_RUN_DIR/report/compare/ for several runs)")
    r.add_argument("--json", action="store_true", help="print the machine-readable summary (JSON) instead of tables")
    r.add_argument("--no-plots", action="store_true", help="skip the PNG plots (faster)")
    return r


def run(args):
    import json

    from control_node import report
    doc, out = report.generate(args.run_dirs, out=args.out, plots=not args.no_plots)
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        report.print_terminal(doc["runs"])
        print(f"wrote {out / 'report.html'}, report.json, .hgrm files" + ("" if args.no_plots else ", PNG plots")
              + f" in {out}")
    return 0
