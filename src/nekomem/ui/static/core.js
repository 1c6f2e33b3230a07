// Shared helpers of the memory browser: DOM building, API calls, formatting.
import { t } from "./i18n.js";

const TOKEN_KEY = "nekomem.token";

export class ApiError extends Error {
  constructor(status, code, message) { super(message); this.status = status; this.code = code; }
}

// h("div", {class: "x", onclick: f}, "text", child) — text is always a text node (no HTML).
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "value") el.value = v;
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

export function getToken() { return sessionStorage.getItem(TOKEN_KEY) || ""; }
export function setToken(v) { if (v) sessionStorage.setItem(TOKEN_KEY, v); else sessionStorage.removeItem(TOKEN_KEY); }

// Same-origin JSON call; writes carry Content-Type: application/json; a token, when
// given, goes as a bearer header. Throws ApiError with the server's error_code.
export async function api(method, path, body) {
  const headers = { Accept: "application/json" };
  const token = getToken();
  if (token) headers.Authorization = "Bearer " + token;
  const init = { method, headers, credentials: "same-origin" };
  if (method !== "GET") {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body === undefined ? {} : body);
  }
  let r;
  try { r = await fetch(path, init); }
  catch (e) { throw Object.assign(new ApiError(0, "unreachable", t("server_down")), { textKey: "server_down" }); }  // the browser's TypeError is not for people
  const type = r.headers.get("content-type") || "";
  const data = type.includes("json") ? await r.json().catch(() => null) : await r.text();
  if (!r.ok) {
    const code = data && data.error_code ? data.error_code : "http_" + r.status;
    if (r.status === 401) {
      // Without a token the server is asking for one; with one, that token is wrong.
      const wrong = Boolean(token);
      document.dispatchEvent(new CustomEvent("nekomem-auth", { detail: { wrong } }));
      const key = wrong ? "wrong_token" : "need_token";
      throw Object.assign(new ApiError(401, code, t(key)), { textKey: key });
    }
    throw new ApiError(r.status, code, (data && data.message) || String(data));
  }
  return data;
}

export function qs(params) {
  const u = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== undefined && v !== null && v !== "") u.set(k, v);
  const s = u.toString();
  return s ? "?" + s : "";
}

export function fmtTime(iso) {
  if (!iso) return "—";
  const d = new Date(iso);
  if (isNaN(d)) return iso;
  return d.toLocaleString(document.documentElement.lang || undefined, { dateStyle: "medium", timeStyle: "short" });
}

export function fmtNum(x, digits = 3) {
  if (x === null || x === undefined) return "—";
  return Number(x).toFixed(digits);
}

// A datetime-local input's value as ISO 8601 (UTC) ("" stays "").
export function localToIso(v) { return v ? new Date(v).toISOString() : ""; }

// An ISO 8601 time as a datetime-local value in the browser's zone ("" when absent).
export function isoToLocal(iso) {
  const d = iso ? new Date(iso) : null;
  if (!d || isNaN(d)) return "";
  const p = (n) => String(n).padStart(2, "0");
  return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())}T${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}`;
}

export function status(msg, kind = "warn") {
  const el = document.getElementById("status");
  el.textContent = msg || "";
  el.className = kind;
  el.removeAttribute("data-code");
}

// A failed call in words: the server down and a missing or wrong token get their own
// sentence in the page's language; other refusals show the server's code and message.
export function showError(e) {
  if (!(e instanceof ApiError)) { status(`${t("error")}: ${e && e.message ? e.message : String(e)}`); return; }
  // (textKey: said again in the language of now, not of when it failed)
  status(e.textKey ? t(e.textKey) : `${t("error")}: ${e.status} ${e.code} — ${e.message}`);
  document.getElementById("status").setAttribute("data-code", e.code);
}

// "@subject/<kind>:<id>" (a persona section of a group chat or a participant) in words.
export function entityLabel(entity) {
  const m = /^@subject\/([a-z_]+):(.*)$/.exec(entity || "");
  if (!m) return t("ent_" + entity) || entity;
  const label = t("subj_" + m[1]);
  return label ? label.replace("{id}", m[2]) : entity;
}

// Pager: "Previous / x–y of n / Next"; calls go(offset).
export function pager(total, offset, limit, go, testid) {
  const end = Math.min(total, offset + limit);
  return h("div", { class: "pager", "data-test": testid || "pager" },
    h("button", { type: "button", "data-test": "prev", disabled: offset <= 0, onclick: () => go(Math.max(0, offset - limit)) }, t("previous")),
    h("span", { "data-test": "range" }, total ? `${offset + 1}–${end} / ${total}` : t("nothing")),
    h("button", { type: "button", "data-test": "next", disabled: end >= total, onclick: () => go(offset + limit) }, t("next")));
}

export function field(label, input) { return h("label", {}, label, input); }

export function select(name, options, value) {
  return h("select", { name }, options.map(([v, label]) => h("option", { value: v, selected: v === value }, label)));
}

// A modal dialog: ``body`` (nodes) above a confirm and a cancel button. Resolves to
// ``confirmed()`` on confirm and to ``cancelled`` on cancel or Escape; ``test`` prefixes the
// data-test names of the dialog and its buttons.
export function modal(test, body, action, cancelLabel, confirmed, cancelled, focus) {
  return new Promise((resolve) => {
    const dialog = h("dialog", { class: "erase", "data-test": test + "-dialog" });
    const close = (answer) => { dialog.close(); dialog.remove(); resolve(answer); };
    dialog.append(
      ...body,
      h("div", { class: "actions" },
        h("button", { type: "button", class: "danger", "data-test": test + "-confirm", onclick: () => close(confirmed()) }, action),
        " ",
        h("button", { type: "button", "data-test": test + "-cancel", onclick: () => close(cancelled) }, cancelLabel)));
    dialog.addEventListener("cancel", () => close(cancelled));
    document.body.append(dialog);
    dialog.showModal();
    if (focus) focus.focus();
  });
}
