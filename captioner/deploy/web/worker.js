// The page's model, in a module Web Worker so that decoding never freezes the page: onnxruntime-web runs the
// export's three graphs (encoder, decoder_init, decoder_step) and search.js searches as the Python runtime does.
// Messages in: {id, kind: "load", site, manifest, base} | {id, kind: "caption", file, options}
// | {id, kind: "pixels", pixels, options}; out: {id, ok: true, result} or {id, ok: false, error}.

import { decodeHypotheses } from "./search.js";
import { preprocess } from "./preprocess.js";

const GRAPHS = ["encoder", "decoder_init", "decoder_step"];
const CDN = "https://cdn.jsdelivr.net"; // the one origin besides the site's the page may load code from
let model = null; // {ort, sessions, manifest, rules, size, memoryNames, stateNames}

self.onmessage = async ({ data }) => {
  try {
    const result = await handle(data);
    self.postMessage({ id: data.id, ok: true, result }, transferables(result));
  } catch (error) {
    self.postMessage({ id: data.id, ok: false, error: String(error && error.message ? error.message : error) });
  }
};

async function handle(message) {
  if (message.kind === "load") return load(message.site, message.manifest, message.base);
  if (!model) throw new Error("the model is not loaded yet");
  if (message.kind === "caption") return caption(await preprocess(message.file, model.size), message.options);
  if (message.kind === "pixels") return caption(message.pixels, message.options);
  throw new Error(`unknown request ${message.kind}`);
}

// onnxruntime-web from the site or the CDN, then one session per graph, each file checked against onnx.json.
async function load(site, manifest, base) {
  const ortUrl = new URL(site.ort.url, base).href;
  const home = new URL(base).origin;
  if (![home, CDN].includes(new URL(ortUrl).origin)) {
    throw new Error(`site.json: ort.url must be on this site or ${CDN}, not ${ortUrl}`);
  }
  if (new URL(site.model, base).origin !== home) throw new Error("site.json: the model must be on this site");
  let ort;
  try {
    ort = await import(ortUrl + "ort.wasm.min.mjs");
  } catch (error) {
    throw new Error(`onnxruntime-web could not be loaded from ${ortUrl} (${error.message})`);
  }
  ort.env.wasm.wasmPaths = ortUrl;
  ort.env.wasm.numThreads = self.crossOriginIsolated ? Math.min(4, navigator.hardwareConcurrency || 1) : 1;
  ort.env.logLevel = "error";
  const folder = new URL(site.model, base);
  const sessions = {};
  for (const graph of GRAPHS) {
    const entry = manifest.files[graph];
    if (typeof entry.path !== "string" || /[/\\:]/.test(entry.path) || [".", ".."].includes(entry.path)) {
      throw new Error(`onnx.json: files.${graph}.path must be a file name beside onnx.json`);
    }
    const url = new URL(entry.path, folder);
    const response = await fetch(url);
    if (!response.ok) throw new Error(`model/${entry.path}: ${response.status} ${response.statusText}`);
    const bytes = new Uint8Array(await response.arrayBuffer());
    if (self.crypto && self.crypto.subtle && (await sha256(bytes)) !== entry.sha256) {
      throw new Error(`model/${entry.path} is corrupt: its sha256 is not the one onnx.json records`);
    }
    try {
      sessions[graph] = await ort.InferenceSession.create(bytes, { executionProviders: ["wasm"] });
    } catch (error) {
      throw new Error(`model/${entry.path}: onnxruntime-web cannot load it (${firstLine(error)})`);
    }
    const names = manifest.graphs[graph];
    if (String(sessions[graph].inputNames) !== String(names.inputs)
        || String(sessions[graph].outputNames) !== String(names.outputs)) {
      throw new Error(`model/${entry.path}: its inputs and outputs are not those onnx.json lists`);
    }
  }
  const spec = manifest.spec;
  const size = spec.vocab.length;
  const banned = new Uint8Array(size);
  for (const name of ["pad", "bos", "unk"]) banned[spec.special_tokens[name]] = 1;
  const badEndings = new Uint8Array(size);
  for (const id of site.bad_endings) badEndings[id] = 1;
  model = {
    ort, sessions, manifest, size: spec.preprocessing.image_size,
    rules: { bos: spec.special_tokens.bos, eos: spec.special_tokens.eos, banned, badEndings },
    memoryNames: manifest.memory.map((k) => `memory.${k}`),
    stateNames: manifest.state.map((k) => `state.${k}`),
  };
  return { threads: ort.env.wasm.numThreads };
}

// uint8 pixels (3, S, S) -> the best caption: tokens, log-probabilities and every word's maps (T, L, H, N).
async function caption(pixels, options) {
  const { ort, sessions, size, memoryNames, stateNames } = model;
  const started = performance.now();
  const images = new ort.Tensor("uint8", pixels, [1, 3, size, size]);
  const feats = (await sessions.encoder.run({ images })).feats;
  const init = await sessions.decoder_init.run({ feats });
  const memory = Object.fromEntries(memoryNames.map((name) => [name, init[name]]));
  const state = Object.fromEntries(stateNames.map((name) => [name, init[name]]));
  const step = async (memoryRows, prevTokens, stateRows) => {
    const prev = new ort.Tensor("int64", BigInt64Array.from(prevTokens, (t) => BigInt(t)), [prevTokens.length]);
    const feeds = { ...asTensors(memoryRows), prev_tokens: prev, ...asTensors(stateRows) };
    const out = await sessions.decoder_step.run(feeds);
    const next = Object.fromEntries(stateNames.map((name) => [name, out[`next_${name}`]]));
    return { logprobs: out.logprobs.data, attn: out.attn.data, attnDims: out.attn.dims.slice(1), state: next };
  };
  const ranked = await decodeHypotheses(step, memory, state, model.rules, options, 1);
  const best = ranked[0][0];
  const words = best.tokens.map((t) => model.manifest.spec.vocab[t]);
  return {
    words, tokens: best.tokens, score: best.score, logprob: best.logprob, finished: best.finished,
    attn: best.attn, attnDims: best.attnDims, grid: model.manifest.spec.grid, ms: performance.now() - started,
  };
}

function asTensors(tensors) {
  const ort = model.ort;
  return Object.fromEntries(Object.entries(tensors).map(
    ([name, t]) => [name, t instanceof ort.Tensor ? t : new ort.Tensor(t.type, t.data, t.dims)]));
}

async function sha256(bytes) {
  const digest = new Uint8Array(await self.crypto.subtle.digest("SHA-256", bytes));
  return Array.from(digest, (b) => b.toString(16).padStart(2, "0")).join("");
}

function firstLine(error) {
  return String(error && error.message ? error.message : error).split("\n")[0].slice(0, 200);
}

function transferables(result) {
  return result && result.attn && result.attn.buffer ? [result.attn.buffer] : [];
}
