// A small OpenAI-compatible chat-completions server around node-llama-cpp, for `make e2e-model`.
//
// node-llama-cpp has no OpenAI server of its own. This one serves POST /v1/chat/completions
// (non-streaming), GET /v1/models and GET /health on 127.0.0.1, one generation at a time
// (2 CPU threads; a second request waits its turn). A request whose client goes away is
// aborted, so a timed-out call does not keep the CPU busy.
//
// Structured output: `response_format` {"type": "json_object", "schema": ...} is enforced
// with node-llama-cpp's JSON-schema grammar ({"type": "json_object"} alone: any JSON). What
// happens to {"type": "json_schema"} and to the token-limit parameter names is chosen on the
// command line, so the client's negotiation can be exercised against a real model:
//   --json-schema grammar   enforce it with the grammar (what OpenAI-style servers do)
//   --json-schema reject    answer 500 (what llama-cpp-python's server does)
//   --tokens-param both     accept max_tokens and max_completion_tokens
//   --tokens-param max_tokens   answer 400 to max_completion_tokens (older servers)
//
// Usage: node server.mjs --model FILE.gguf [--port 0] [--threads 2] [--context 8192]
//        [--json-schema grammar|reject] [--tokens-param both|max_tokens] [--max-output 1024]
// Prints one line `LISTENING <port>` on stdout once the model is loaded.

import { createHash } from "node:crypto";
import http from "node:http";
import { parseArgs } from "node:util";
import { getLlama, LlamaChat, LlamaLogLevel } from "node-llama-cpp";

const { values: args } = parseArgs({
  options: {
    model: { type: "string" },
    host: { type: "string", default: "127.0.0.1" },
    port: { type: "string", default: "0" },
    threads: { type: "string", default: "2" },
    context: { type: "string", default: "8192" },
    "json-schema": { type: "string", default: "grammar" },
    "tokens-param": { type: "string", default: "both" },
    "max-output": { type: "string", default: "1024" },
  },
});
if (!args.model) {
  console.error("usage: node server.mjs --model FILE.gguf [options]");
  process.exit(2);
}
if (!["grammar", "reject"].includes(args["json-schema"]) || !["both", "max_tokens"].includes(args["tokens-param"])) {
  console.error("--json-schema takes grammar|reject, --tokens-param takes both|max_tokens");
  process.exit(2);
}
const threads = Number(args.threads);
const contextSize = Number(args.context);
const maxOutputCap = Number(args["max-output"]);

const llama = await getLlama({ gpu: false, build: "never", maxThreads: threads, logLevel: LlamaLogLevel.error });
const model = await llama.loadModel({ modelPath: args.model });
const context = await model.createContext({ contextSize, threads, sequences: 1 });
const sequence = context.getSequence();
const modelId = args.model.split("/").pop().replace(/\.gguf$/, "");
const grammarCache = new Map();
let counter = 0;
let queue = Promise.resolve();
// Per task (the X-Nekomem-Task header): requests, answers by HTTP status, answers cut at the
// token limit, generation milliseconds, and the most times one identical prompt was sent (a
// task asked again and again about the same input is the signature of a loop). GET /stats
// returns it for the e2e report.
const stats = {};
const promptCounts = new Map();

function countPrompt(task, body) {
  const key = `${task}:${createHash("sha256").update(JSON.stringify(body?.messages ?? null)).digest("hex")}`;
  const seen = (promptCounts.get(key) ?? 0) + 1;
  promptCounts.set(key, seen);
  const entry = (stats[task || "-"] ??= { requests: 0, statuses: {}, length: 0, ms: 0, max_identical: 0 });
  entry.max_identical = Math.max(entry.max_identical, seen);
}

function record(task, status, finishReason, ms) {
  const entry = (stats[task || "-"] ??= { requests: 0, statuses: {}, length: 0, ms: 0, max_identical: 0 });
  entry.requests += 1;
  entry.statuses[status] = (entry.statuses[status] ?? 0) + 1;
  if (finishReason === "length") entry.length += 1;
  entry.ms += ms;
}

class HttpError extends Error {
  constructor(status, message, type = "invalid_request_error") {
    super(message);
    this.status = status;
    this.type = type;
  }
}

// msgspec writes nullable fields as anyOf and adds titles and bounds; the grammar builder
// takes oneOf and ignores what it cannot enforce.
function grammarSchema(schema) {
  if (Array.isArray(schema)) return schema.map(grammarSchema);
  if (schema === null || typeof schema !== "object") return schema;
  const out = {};
  for (const [key, value] of Object.entries(schema)) {
    if (["title", "minimum", "maximum", "default", "examples"].includes(key)) continue;
    out[key === "anyOf" ? "oneOf" : key] = grammarSchema(value);
  }
  return out;
}

async function grammarFor(responseFormat) {
  if (!responseFormat || responseFormat.type === "text") return null;
  let schema;
  if (responseFormat.type === "json_schema") {
    if (args["json-schema"] === "reject") {
      throw new HttpError(500, "Internal Server Error", "server_error");
    }
    schema = responseFormat.json_schema?.schema;
    if (!schema) throw new HttpError(400, "response_format.json_schema.schema is required");
  } else if (responseFormat.type === "json_object") {
    schema = responseFormat.schema;
    if (!schema) return llama.getGrammarFor("json");
  } else {
    throw new HttpError(400, `response_format type ${JSON.stringify(responseFormat.type)} is not supported`);
  }
  const key = JSON.stringify(schema);
  if (!grammarCache.has(key)) {
    try {
      grammarCache.set(key, await llama.createGrammarForJsonSchema(grammarSchema(schema)));
    } catch (error) {
      throw new HttpError(400, `response_format schema cannot be turned into a grammar: ${error.message}`);
    }
  }
  return grammarCache.get(key);
}

function contentText(content) {
  if (typeof content === "string") return content;
  if (Array.isArray(content)) return content.map((p) => (p && typeof p.text === "string" ? p.text : "")).join("");
  return "";
}

function toHistory(messages) {
  if (!Array.isArray(messages) || messages.length === 0) throw new HttpError(400, "messages must be a non-empty array");
  const history = messages.map((m) => {
    const text = contentText(m?.content);
    if (m?.role === "system" || m?.role === "developer") return { type: "system", text };
    if (m?.role === "assistant") return { type: "model", response: [text] };
    if (m?.role === "user") return { type: "user", text };
    throw new HttpError(400, `unknown message role ${JSON.stringify(m?.role)}`);
  });
  history.push({ type: "model", response: [] });
  return history;
}

function outputLimit(body) {
  if (args["tokens-param"] === "max_tokens" && body.max_completion_tokens !== undefined) {
    throw new HttpError(400, "Unrecognized request argument supplied: max_completion_tokens");
  }
  const asked = body.max_completion_tokens ?? body.max_tokens ?? maxOutputCap;
  if (!Number.isInteger(asked) || asked < 1) throw new HttpError(400, "the output-token limit must be a positive integer");
  return Math.min(asked, maxOutputCap);
}

async function complete(body, signal) {
  const history = toHistory(body.messages);
  const maxTokens = outputLimit(body);
  const grammar = await grammarFor(body.response_format);
  const promptTokens = history.reduce((n, item) => n + model.tokenize(item.text ?? item.response.join("")).length + 4, 0);
  if (promptTokens + 16 > contextSize) {
    throw new HttpError(400, `prompt of about ${promptTokens} tokens exceeds the context of ${contextSize}`, "context_length_exceeded");
  }
  const chat = new LlamaChat({ contextSequence: sequence, autoDisposeSequence: false });
  try {
    const result = await chat.generateResponse(history, {
      maxTokens: Math.min(maxTokens, contextSize - promptTokens),
      temperature: typeof body.temperature === "number" ? body.temperature : 0,
      grammar: grammar ?? undefined,
      signal,
      stopOnAbortSignal: false,
    });
    const completionTokens = model.tokenize(result.response).length;
    return {
      id: `chatcmpl-e2e-${++counter}`,
      object: "chat.completion",
      created: Math.floor(Date.now() / 1000),
      model: modelId,
      choices: [
        {
          index: 0,
          message: { role: "assistant", content: result.response },
          finish_reason: result.metadata.stopReason === "maxTokens" ? "length" : "stop",
        },
      ],
      usage: { prompt_tokens: promptTokens, completion_tokens: completionTokens, total_tokens: promptTokens + completionTokens },
    };
  } finally {
    chat.dispose({ disposeSequence: false });
  }
}

function send(res, status, obj) {
  if (res.writableEnded || res.destroyed) return;
  const data = Buffer.from(JSON.stringify(obj));
  res.writeHead(status, { "Content-Type": "application/json", "Content-Length": data.length });
  res.end(data);
}

async function readBody(req) {
  const chunks = [];
  for await (const chunk of req) chunks.push(chunk);
  try {
    return JSON.parse(Buffer.concat(chunks).toString("utf8"));
  } catch {
    throw new HttpError(400, "body is not JSON");
  }
}

const server = http.createServer(async (req, res) => {
  const path = (req.url || "").split("?")[0].replace(/\/$/, "");
  const task = req.headers["x-nekomem-task"];
  const started = Date.now();
  let status = 0;
  let finishReason = null;
  res.on("finish", () => path === "/v1/chat/completions" && record(task, status, finishReason, Date.now() - started));
  res.on("close", () => !res.writableFinished && path === "/v1/chat/completions" && record(task, "aborted", null, Date.now() - started));
  try {
    if (req.method === "GET" && path === "/v1/models") {
      return send(res, 200, { object: "list", data: [{ id: modelId, object: "model", owned_by: "local" }] });
    }
    if (req.method === "GET" && path === "/health") return send(res, 200, { status: "ok", model: modelId });
    if (req.method === "GET" && path === "/stats") return send(res, 200, stats);
    if (req.method !== "POST" || path !== "/v1/chat/completions") throw new HttpError(404, "not found");
    const body = await readBody(req);
    countPrompt(task, body);
    if (body.stream) throw new HttpError(400, "stream is not supported");
    const abort = new AbortController();
    res.on("close", () => abort.abort(new Error("client went away")));
    const turn = queue.then(() => (abort.signal.aborted ? null : complete(body, abort.signal)));
    queue = turn.catch(() => undefined);
    const answer = await turn;
    if (answer !== null) {
      status = 200;
      finishReason = answer.choices[0].finish_reason;
      send(res, 200, answer);
    }
  } catch (error) {
    if (error instanceof HttpError) {
      status = error.status;
      return send(res, error.status, { error: { message: error.message, type: error.type } });
    }
    if (res.destroyed) return;
    status = 500;
    send(res, 500, { error: { message: `generation failed: ${error?.message ?? error}`, type: "server_error" } });
  }
});
server.keepAliveTimeout = 60_000;
server.listen(Number(args.port), args.host, () => {
  process.stdout.write(`LISTENING ${server.address().port}\n`);
});
for (const signal of ["SIGINT", "SIGTERM"]) {
  process.on(signal, () => {
    server.close();
    process.exit(0);
  });
}
