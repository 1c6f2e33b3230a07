// The evidence chart of one reflection, drawn as inline SVG (no library).
import { t } from "./i18n.js";

const NS = "http://www.w3.org/2000/svg";
function s(tag, attrs, text) {
  const el = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
  if (text !== undefined) el.textContent = text;
  return el;
}

// history: the /api/browse/{name}/reflections/{id}/evidence answer.
export function evidenceChart(history, width = 640, height = 230) {
  const pad = { l: 44, r: 96, t: 26, b: 28 };
  const pts = history.curve;
  const th = history.thresholds;
  const svg = s("svg", { class: "chart", width, height, viewBox: `0 0 ${width} ${height}`, role: "img",
    "data-test": "evidence-chart", "data-points": pts.length, "data-events": history.events.length,
    "data-net": pts.length ? pts[pts.length - 1].net : "" });
  svg.append(s("title", {}, t("chart_title")));
  if (!pts.length) { svg.append(s("text", { x: 10, y: 20 }, t("no_history"))); return svg; }
  const t0 = Date.parse(pts[0].t), t1 = Math.max(Date.parse(pts[pts.length - 1].t), t0 + 1000);
  const values = pts.flatMap((p) => [p.reinforcement, -p.disputation, p.net, p.disputation]).concat([th.confirm, th.promote, th.archive, 0]);
  let lo = Math.min(...values), hi = Math.max(...values);
  const span = hi - lo || 1; lo -= span * 0.08; hi += span * 0.08;
  const x = (ms) => pad.l + ((ms - t0) / (t1 - t0)) * (width - pad.l - pad.r);
  const y = (v) => pad.t + (1 - (v - lo) / (hi - lo)) * (height - pad.t - pad.b);
  svg.append(s("line", { class: "axis", x1: pad.l, x2: width - pad.r, y1: y(0), y2: y(0) }));
  svg.append(s("line", { class: "axis", x1: pad.l, x2: pad.l, y1: pad.t, y2: height - pad.b }));
  for (const v of [lo, 0, hi]) svg.append(s("text", { x: 4, y: y(v) + 3 }, v.toFixed(2)));
  const label = (ms) => (t1 - t0 < 2 * 86400e3 ? new Date(ms).toLocaleString() : new Date(ms).toLocaleDateString());
  svg.append(s("text", { x: pad.l, y: height - 8 }, label(t0)));
  svg.append(s("text", { x: width - pad.r, y: height - 8, "text-anchor": "end" }, label(t1)));
  for (const [key, v] of [["confirm", th.confirm], ["promote", th.promote], ["archive", th.archive]]) {
    svg.append(s("line", { class: `th ${key}`, x1: pad.l, x2: width - pad.r, y1: y(v), y2: y(v), "data-test": `threshold-${key}` }));
    svg.append(s("text", { x: width - pad.r + 4, y: y(v) + 3 }, `${t("th_" + key)} ${v}`));
  }
  const line = (cls, f) => s("polyline", { class: cls, "data-test": `line-${cls}`, points: pts.map((p) => `${x(Date.parse(p.t)).toFixed(1)},${y(f(p)).toFixed(1)}`).join(" ") });
  svg.append(line("rein", (p) => p.reinforcement), line("disp", (p) => p.disputation), line("net", (p) => p.net));
  for (const e of history.events) {
    const ms = Date.parse(e.t);
    svg.append(s("circle", { cx: x(ms), cy: y(e.net), r: 3, fill: "#333", "data-test": "event-dot" }, undefined));
  }
  const legend = [["net", t("net_score")], ["rein", t("reinforcement")], ["disp", t("disputation")]];
  legend.forEach(([cls, text], i) => {
    const lx = pad.l + i * 130;
    svg.append(s("line", { class: cls, x1: lx, x2: lx + 14, y1: 11, y2: 11 }));
    svg.append(s("text", { x: lx + 18, y: 14 }, text));
  });
  return svg;
}
