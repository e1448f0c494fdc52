// Time-series charts over the history the API keeps (GET /api/history), drawn by the
// vendored uPlot (window.uPlot, loaded by the shell before the modules run).

import { h } from "./dom.js";

const COLORS = ["#2f6fb0", "#e07b00", "#2e8b57", "#b03a5b", "#6b5bb0"];

// series: {label: [[ms, value], ...]} -> uPlot's columns [xs in seconds, ys...] on the union
// of the sample times (a series without a sample at a time gets a gap there).
export function columns(series) {
  const labels = Object.keys(series);
  const times = [...new Set(labels.flatMap((l) => series[l].map((p) => p[0])))].sort((a, b) => a - b);
  const at = labels.map((l) => new Map(series[l].map(([t, v]) => [t, v])));
  return [times.map((t) => t / 1000), ...at.map((m) => times.map((t) => (m.has(t) ? m.get(t) : null)))];
}

const MIN_SPAN_S = 60;
// Tick steps of a count (lag): whole numbers only.
const WHOLE_STEPS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1e3, 2e3, 5e3, 1e4, 2e4, 5e4, 1e5, 2e5, 5e5, 1e6, 1e7];

export class TimeChart {
  constructor(title, { whole = false } = {}) {
    this.whole = whole;
    this.plot = null;
    this.labels = null;
    this.el = h("div", { class: "chart" }, h("h3", {}, title));
    this.box = h("div", { class: "chart-box" });
    this.note = h("p", { class: "empty" }, "No samples yet: the server samples every few seconds.");
    this.el.append(this.box, this.note);
    new ResizeObserver(() => this.resize()).observe(this.box);
  }

  size() {
    return { width: Math.max(this.box.clientWidth, 200), height: 220 };
  }

  resize() {
    if (this.plot) this.plot.setSize(this.size());
  }

  update(series) {
    const data = columns(series);
    const empty = data[0].length === 0;
    this.note.hidden = !empty;
    this.box.hidden = empty;
    const labels = Object.keys(series).join("|");
    if (this.plot && labels === this.labels) {
      this.plot.setData(data);
      return;
    }
    if (this.plot) this.plot.destroy();
    this.labels = labels;
    this.plot = new window.uPlot(
      {
        ...this.size(),
        legend: { live: true },
        cursor: { drag: { x: false, y: false } },
        scales: {
          // at least MIN_SPAN_S wide, so a young history reads as "the last minutes", not seconds
          x: { time: true, range: (u, min, max) => [Math.min(min, max - MIN_SPAN_S), max] },
          y: { range: (u, min, max) => [0, Math.max(1, max * 1.1)] },
        },
        axes: [
          {},
          {
            size: 60,
            ...(this.whole ? { incrs: WHOLE_STEPS } : {}),
            values: (u, ticks) => ticks.map(formatShort),
          },
        ],
        series: [
          {},
          ...Object.keys(series).map((label, i) => ({
            label,
            stroke: COLORS[i % COLORS.length],
            width: 2,
            fill: i === 0 ? `${COLORS[0]}18` : undefined,
            spanGaps: false,
            value: (u, v) => (v === null || v === undefined ? "—" : formatShort(v)),
          })),
        ],
      },
      data,
      this.box,
    );
  }
}

function formatShort(v) {
  const abs = Math.abs(v);
  if (abs >= 1e6) return `${(v / 1e6).toFixed(1)}M`;
  if (abs >= 1e4) return `${(v / 1e3).toFixed(0)}k`;
  if (abs >= 1e3) return `${(v / 1e3).toFixed(1)}k`;
  return Number.isInteger(v) ? String(v) : v.toFixed(1);
}
