"""The report's panel for a run that balanced itself (run.balance=auto): each knob over time beside throughput, each
move marked (kept or undone), and one row per move for the summary table."""

from __future__ import annotations

KNOBS = (("balance/actors", "actors"), ("balance/envs_per_actor", "envs per actor"),
         ("balance/learner_threads", "learner threads"), ("balance/inference_wait_ms", "inference wait (ms)"))


def balance_figure(m: list[dict], moves: list[dict], plt):
    """Throughput (top) and the layout's knobs (below) against env steps, or None if the run did not balance."""
    rows = [r for r in m if "balance/actors" in r]
    if not rows:
        return None
    t = [r["steps"] for r in rows]
    knobs = [(k, label) for k, label in KNOBS if len({r.get(k) for r in rows}) > 1 or k == "balance/actors"]
    fig, axes = plt.subplots(1 + len(knobs), 1, figsize=(7, 1.6 + 1.1 * len(knobs)), sharex=True)
    axes[0].plot(t, [r.get("sps") for r in rows], color="tab:blue")
    axes[0].set_ylabel("steps/s")
    axes[0].set_title("Self-balancing: throughput and layout")
    for ax, (k, label) in zip(axes[1:], knobs):
        ax.step(t, [r.get(k) for r in rows], where="post", color="tab:gray")
        ax.set_ylabel(label, fontsize=8)
    for mv in moves:
        if mv.get("event") == "move":
            color = "tab:green" if mv.get("outcome") == "kept" else "tab:red"
            for ax in axes:
                ax.axvline(mv["steps"], color=color, alpha=0.4, lw=1)
    axes[-1].set_xlabel("env steps (lines: a move, green kept, red undone)")
    fig.tight_layout()
    return fig


def balance_rows(balance: dict | None) -> list[tuple[str, str]]:
    """Summary rows: the start and final layouts with their measured throughput, and each move."""
    if not balance:
        return []

    def lay(d: dict) -> str:
        return ", ".join(f"{k} {v:g}" for k, v in d.items() if v)

    def sps(v) -> str:
        return f"{v:,.0f} steps/s" if isinstance(v, (int, float)) else "n/a"

    rows = [("balance: start", f"{lay(balance['start'])} ({sps(balance.get('start_sps'))})"),
            ("balance: found", f"{lay(balance['final'])} ({sps(balance.get('final_sps'))}, config: balanced.json)")]
    for mv in balance.get("moves", []):
        if mv.get("event") == "move" and "outcome" in mv:
            moved = ", ".join(f"{k} {mv['from'][k]:g} -> {mv['to'][k]:g}" for k in mv["moved"])
            rows.append((f"move at {mv['t']:.0f} s: {moved}",
                         f"{mv['outcome']}: measured {sps(mv['measured_sps'])} against {sps(mv['base_sps'])} "
                         f"({mv['gain']:+.0%}, needed {mv['margin']:+.0%}); "
                         + (f"predicted {sps(mv['predicted_sps'])}, {mv['bound']}-bound"
                            if mv.get("predicted_sps") is not None else mv.get("why", ""))))
        elif mv.get("event") == "recheck":
            rows.append((f"re-check at {mv['t']:.0f} s", mv["why"]))
    return rows
