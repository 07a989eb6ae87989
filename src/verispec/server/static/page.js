// verispec's page: sends what any client would send to this server's OpenAI endpoints (streamed, with
// verification.token_details) and draws each token with its mark. No build step, nothing loaded from outside.
"use strict";

const DATA = JSON.parse(document.getElementById("page-data").textContent);
const SPEC = DATA.spec;
const DETAIL_TOP = 8; // most probable tokens per distribution asked for (verification.token_details)
const $ = (sel, root = document) => root.querySelector(sel);
const $$ = (sel, root = document) => Array.from(root.querySelectorAll(sel));
const SVGNS = "http://www.w3.org/2000/svg";
const CHART_ROWS = 10; // bars groups in a token's chart

function el(tag, attrs = {}, ...children) {
  const node = tag.startsWith("svg:") ? document.createElementNS(SVGNS, tag.slice(4)) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "text") node.textContent = v;
    else if (k === "class") node.setAttribute("class", v);
    else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c);
  return node;
}

// a token's text with its whitespace made visible (for labels and the aligned view)
function visible(text) {
  return text.replace(/\n/g, "\u21b5").replace(/\t/g, "\u21e5").replace(/ /g, "\u2423") || "\u2205";
}

function fmt(x, digits = 3) {
  return x === null || x === undefined ? "-" : Number(x).toFixed(digits);
}

// ---------------------------------------------------------------------------------------------- the form

function showRuleParams(side) {
  const rule = $(`#rule-${side}`).value;
  for (const fs of $$(`fieldset.params[data-side="${side}"]`)) fs.hidden = fs.dataset.rule !== rule;
}

function readValue(input) {
  const type = input.dataset.type;
  if (type === "boolean") return input.checked;
  const raw = input.value.trim();
  if (raw === "") return undefined;
  if (type === "number" || type === "integer") {
    const n = Number(raw);
    return Number.isNaN(n) ? raw : n; // the server says what is wrong with it
  }
  return raw;
}

function verification(side) {
  const rule = $(`#rule-${side}`).value;
  const params = {};
  for (const input of $$(`fieldset.params[data-side="${side}"][data-rule="${rule}"] [data-param]`)) {
    const v = readValue(input);
    if (v !== undefined) params[input.dataset.param] = v;
  }
  return { rule, params, verifier: $("#verifier").value, token_details: DETAIL_TOP };
}

function requestBody(side, seed) {
  const mode = $('input[name="mode"]:checked').value;
  const body = { model: DATA.model, stream: true, stream_options: { include_usage: true } };
  const prompt = $("#prompt").value;
  if (mode === "chat") body.messages = [{ role: "user", content: prompt }];
  else body.prompt = prompt;
  for (const input of $$("[data-field]")) {
    const v = readValue(input);
    if (v !== undefined) body[input.dataset.field] = v;
  }
  if (seed !== undefined) body.seed = seed;
  body.verification = verification(side);
  const g = $("#gamma").value.trim();
  if (g !== "") body.speculative = { gamma: g === "auto" ? "auto" : (Number.isInteger(Number(g)) ? Number(g) : g) };
  return { url: mode === "chat" ? "/v1/chat/completions" : "/v1/completions", body };
}

// ---------------------------------------------------------------------------------------------- a run

class Run {
  constructor(label, container) {
    this.label = label;
    this.tokens = []; // token_details entries, in order
    this.text = "";
    this.rounds = new Set();
    this.accepted = 0;
    this.started = performance.now();
    this.firstTokenMs = null;
    this.final = null; // the verispec block of the last chunk
    this.root = el("div", { class: "run", "data-run": label });
    this.head = el("h3", { text: label });
    this.stats = el("p", { class: "stats" });
    this.out = el("div", { class: "tokens", "data-role": "text" });
    this.root.append(this.head, this.stats, this.out);
    container.append(this.root);
    this.render();
  }

  add(text, details) {
    if (details && details.length) {
      for (const d of details) {
        const i = this.tokens.length;
        this.tokens.push(d);
        this.rounds.add(d.round);
        if (d.mark === "accepted") this.accepted += 1;
        const span = el("span", { class: `tok mark-${d.mark}`, "data-index": String(i), "data-mark": d.mark,
                                  tabindex: "0", role: "button", title: `${d.mark} (round ${d.round + 1})`,
                                  text: d.text });
        this.out.append(span);
      }
      const covered = details.map((d) => d.text).join("");
      if (text !== covered && text.startsWith(covered)) this.out.append(text.slice(covered.length));
    } else if (text) {
      this.out.append(text); // text without tokens: a held-back tail released at the end
    }
    this.text += text;
    if (this.firstTokenMs === null && this.text) {
      this.firstTokenMs = performance.now() - this.started;
      document.body.dataset.firstTokenMs = String(this.firstTokenMs);
    }
    this.render();
  }

  render() {
    const secs = (performance.now() - this.started) / 1000;
    const rounds = this.final ? this.final.metrics.rounds : this.rounds.size;
    const be = this.final ? this.final.metrics.block_efficiency : (rounds ? this.accepted / rounds : 0);
    const tps = this.final && this.final.timings.total_s ? this.tokens.length / this.final.timings.total_s
      : (secs > 0 ? this.tokens.length / secs : 0);
    this.stats.replaceChildren(
      el("span", { class: "stat", "data-stat": "be", text: `block efficiency ${fmt(be, 2)}` }),
      el("span", { class: "stat", "data-stat": "tps", text: `${fmt(tps, 1)} tokens/s` }),
      el("span", { class: "stat", "data-stat": "rounds", text: `${rounds} rounds` }),
      el("span", { class: "stat", "data-stat": "tokens", text: `${this.tokens.length} tokens` }),
    );
  }

  finish(block) {
    this.final = block;
    this.render();
    this.root.dataset.done = "true";
  }
}

async function stream(url, body, run, signal) {
  const resp = await fetch(url, { method: "POST", headers: { "Content-Type": "application/json" },
                                  body: JSON.stringify(body), signal });
  if (!resp.ok) {
    let message = `HTTP ${resp.status}`;
    try {
      const err = (await resp.json()).error;
      message = err.message + (err.param ? ` (field: ${err.param})` : "");
    } catch (e) { /* not JSON */ }
    throw new Error(message);
  }
  const reader = resp.body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buf.indexOf("\n\n")) >= 0) {
      const event = buf.slice(0, cut);
      buf = buf.slice(cut + 2);
      if (!event.startsWith("data: ")) continue;
      const payload = event.slice(6);
      if (payload === "[DONE]") return;
      const chunk = JSON.parse(payload);
      if (chunk.error) throw new Error(chunk.error.message);
      for (const c of chunk.choices || []) {
        const text = c.delta ? (c.delta.content || "") : (c.text || "");
        if (text || c.token_details) run.add(text, c.token_details);
      }
      if (chunk.verispec) run.finish(chunk.verispec);
    }
  }
}

// ---------------------------------------------------------------------------------------------- details

function chart(d) {
  // the CHART_ROWS most probable tokens under any of the three laws, the emitted one always among them
  const rows = d.top.map((id, i) => ({ label: visible(d.top_text[i]), p: d.p[i], q: d.q ? d.q[i] : null,
                                       law: d.law[i], chosen: id === d.token }))
    .sort((a, b) => Math.max(b.p, b.q || 0, b.law) - Math.max(a.p, a.q || 0, a.law))
    .filter((r, i) => i < CHART_ROWS - 1 || r.chosen).slice(0, CHART_ROWS);
  const series = [["p", "target p", "bar-p"], ["q", "draft q", "bar-q"], ["law", "induced law", "bar-law"]]
    .filter(([k]) => k !== "q" || d.q);
  const labelW = 110, barW = 260, rowH = 12 * series.length + 8, top = 22;
  const height = top + rows.length * rowH + 4;
  const svg = el("svg:svg", { width: String(labelW + barW + 60), height: String(height), class: "chart",
                              role: "img", "aria-label": "p, q and the induced law over the top tokens" });
  const defs = el("svg:defs");
  const pat = el("svg:pattern", { id: "hatch", width: "4", height: "4", patternUnits: "userSpaceOnUse",
                                  patternTransform: "rotate(45)" });
  pat.append(el("svg:rect", { width: "4", height: "4", fill: "#E69F00" }),
             el("svg:line", { x1: "0", y1: "0", x2: "0", y2: "4", stroke: "#000", "stroke-width": "1.2" }));
  defs.append(pat);
  svg.append(defs);
  series.forEach(([, name, cls], j) => {
    const x = labelW + j * 95;
    svg.append(el("svg:rect", { x: String(x), y: "4", width: "12", height: "10", class: cls }),
               el("svg:text", { x: String(x + 16), y: "13", class: "axis", text: name }));
  });
  const max = Math.max(1e-9, ...rows.flatMap((r) => series.map(([k]) => r[k] || 0)));
  rows.forEach((r, i) => {
    const y = top + i * rowH;
    svg.append(el("svg:text", { x: String(labelW - 6), y: String(y + rowH / 2 + 3), "text-anchor": "end",
                                class: r.chosen ? "axis chosen" : "axis", text: r.label.slice(0, 14) }));
    series.forEach(([k, name, cls], j) => {
      const v = r[k] || 0;
      const w = Math.max(v / max * barW, v > 0 ? 1 : 0);
      const rect = el("svg:rect", { x: String(labelW), y: String(y + j * 12), width: String(w), height: "10",
                                    class: cls });
      rect.append(el("svg:title", { text: `${name} ${r.label}: ${fmt(v, 4)}` }));
      svg.append(rect, el("svg:text", { x: String(labelW + w + 4), y: String(y + j * 12 + 9), class: "value",
                                        text: fmt(v, 3) }));
    });
  });
  return svg;
}

function showDetail(run, index) {
  const d = run.tokens[index];
  $$(".tok.selected").forEach((s) => s.classList.remove("selected"));
  $$(`.tok[data-index="${index}"]`).forEach((s) => s.classList.add("selected"));
  const box = $("#detail");
  const drafted = d.drafted === null ? "-"
    : `${visible(d.top_text[d.top.indexOf(d.drafted)] ?? "")} (id ${d.drafted})`;
  const facts = el("dl", { class: "facts" },
    el("dt", { text: "token" }),
    el("dd", { text: `${visible(d.top_text[d.top.indexOf(d.token)] ?? d.text)} (id ${d.token})` }),
    el("dt", { text: "mark" }), el("dd", { text: d.mark }),
    el("dt", { text: "round" }), el("dd", { text: `${d.round + 1} (drafted ${d.gamma})` }),
    el("dt", { text: "drafted token" }), el("dd", { text: drafted }),
    el("dt", { text: "its acceptance probability h" }), el("dd", { "data-fact": "h", text: fmt(d.accept_prob) }),
    el("dt", { text: "P(a draft from q is accepted)" }), el("dd", { text: fmt(d.acceptance) }),
    el("dt", { text: "TV(induced law, p)" }), el("dd", { "data-fact": "tv", text: fmt(d.tv, 4) }));
  box.replaceChildren(el("h3", { text: `${run.label}: token ${index + 1}` }), facts, chart(d));
  box.hidden = false;
}

// ---------------------------------------------------------------------------------------------- the aligned view

function aligned(runs) {
  const [a, b] = runs;
  const n = Math.max(a.tokens.length, b.tokens.length);
  const grid = el("div", { class: "aligned", "data-role": "aligned" });
  let diverged = false;
  for (let i = 0; i < n; i++) {
    const ta = a.tokens[i], tb = b.tokens[i];
    const same = ta && tb && ta.token === tb.token;
    if (!same) diverged = true;
    const cell = el("span", { class: `pair${same ? "" : " differs"}${diverged ? " after" : ""}` });
    for (const [run, t] of [[a, ta], [b, tb]]) {
      const s = t ? el("span", { class: `tok mark-${t.mark}`, "data-index": String(i), tabindex: "0",
                                 role: "button", text: visible(t.text || "") })
        : el("span", { class: "tok missing", text: " " });
      if (t) s.addEventListener("click", () => showDetail(run, i));
      cell.append(s);
    }
    grid.append(cell);
  }
  return el("div", { class: "aligned-wrap" },
    el("h3", { text: `Aligned by position: ${a.label} (top) / ${b.label} (bottom)` }), grid);
}

// ---------------------------------------------------------------------------------------------- wiring

let controller = null;

function showError(message) {
  const box = $("#error");
  box.textContent = message;
  box.hidden = false;
  box.scrollIntoView({ block: "nearest" });
}

async function generate(event) {
  event.preventDefault();
  if (controller) controller.abort();
  const ctl = (controller = new AbortController());
  $("#error").hidden = true;
  $("#detail").hidden = true;
  const runsBox = $("#runs");
  runsBox.replaceChildren();
  delete document.body.dataset.state;
  const compare = $("#compare").checked;
  let seed;
  if (compare && $('[data-field="seed"]') && $('[data-field="seed"]').value.trim() === "") {
    seed = Math.floor(Math.random() * 2 ** 31); // the same seed for both sides
  }
  const sides = compare ? ["a", "b"] : ["a"];
  const cols = el("div", { class: compare ? "columns two" : "columns" });
  runsBox.append(cols);
  const runs = sides.map((side) => {
    const v = verification(side);
    const params = Object.entries(v.params).map(([k, x]) => `${k}=${x}`).join(", ");
    return new Run(`${v.rule}${params ? ` (${params})` : ""}`, cols);
  });
  runs.forEach((run) => run.out.addEventListener("click", (e) => {
    const t = e.target.closest(".tok[data-index]");
    if (t) showDetail(run, Number(t.dataset.index));
  }));
  $("#generate").disabled = true;
  $("#stop").disabled = false;
  document.body.dataset.state = "running";
  try {
    await Promise.all(sides.map((side, i) => {
      const { url, body } = requestBody(side, seed);
      return stream(url, body, runs[i], ctl.signal);
    }));
    if (compare) runsBox.append(aligned(runs));
    document.body.dataset.state = "done";
  } catch (err) {
    ctl.abort(); // one side failed: end the other's request too, which would stream on unseen with Stop disabled
    if (runs.every((r) => r.tokens.length === 0)) runsBox.replaceChildren(); // nothing ran: only the error
    if (err.name !== "AbortError") showError(err.message);
    document.body.dataset.state = "error";
  } finally {
    $("#generate").disabled = false;
    $("#stop").disabled = true;
  }
}

document.addEventListener("keydown", (e) => {
  if ((e.key === "Enter" || e.key === " ") && e.target.matches(".tok[data-index]")) {
    e.preventDefault();
    e.target.click();
  }
});
for (const side of ["a", "b"]) $(`#rule-${side}`).addEventListener("change", () => showRuleParams(side));
$("#compare").addEventListener("change", () => { $("#side-b").hidden = !$("#compare").checked; });
$("#form").addEventListener("submit", generate);
$("#stop").addEventListener("click", () => controller && controller.abort());
document.body.dataset.ready = "true";
