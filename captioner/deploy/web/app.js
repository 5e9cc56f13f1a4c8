// The page: reads site.json and the model's onnx.json, hands photographs to the worker (worker.js) and draws the
// caption with one heatmap per word over the photograph, as `captioner demo` does. Model data (its words) is only
// ever set as text (textContent), never as HTML; the page's Content-Security-Policy allows no other script.

import { checkPixels, headerSize } from "./preprocess.js";

const MAX_BYTES = 30 * 1024 * 1024; // a larger file is refused before it is read
const THUMB = 128; // px: a word's map in the strip below the photograph
const $ = (id) => document.getElementById(id);

const worker = new Worker(new URL("worker.js", import.meta.url), { type: "module" });
const pending = new Map();
let nextId = 0;
let site = null;
let manifest = null;
let shown = null; // {bitmap, result}: what the view shows, redrawn when the layer, head or word changes
let selectedWord = 0;

worker.onmessage = ({ data }) => {
  const { resolve, reject } = pending.get(data.id);
  pending.delete(data.id);
  if (data.ok) resolve(data.result);
  else reject(new Error(data.error));
};
worker.onerror = (event) => showError(`the page's worker stopped: ${event.message || "unknown error"}`);

function ask(message, transfer = []) {
  const id = nextId++;
  return new Promise((resolve, reject) => {
    pending.set(id, { resolve, reject });
    worker.postMessage({ ...message, id }, transfer);
  });
}

async function readJson(url, what) {
  let response;
  try {
    response = await fetch(url);
  } catch (error) {
    throw new Error(`${what} could not be read (${error.message}); serve this folder over HTTP`);
  }
  if (!response.ok) throw new Error(`${what}: ${response.status} ${response.statusText}`);
  try {
    return await response.json();
  } catch {
    throw new Error(`${what} is not valid JSON (a corrupt or truncated file)`);
  }
}

async function start() {
  try {
    site = await readJson("site.json", "site.json");
    if (new URL(site.model, location.href).origin !== location.origin) {
      throw new Error("site.json: the model must be on this site");
    }
    manifest = await readJson(site.model, site.model);
    if (!manifest.spec || !Array.isArray(manifest.spec.vocab) || !manifest.files || !manifest.graphs) {
      throw new Error(`${site.model} is not a captioner ONNX manifest (no spec, files or graphs)`);
    }
    setUp();
    const started = performance.now();
    const { threads } = await ask({ kind: "load", site, manifest, base: location.href });
    const from = site.ort.source === "site" ? "this site" : new URL(site.ort.url).host;
    const seconds = ((performance.now() - started) / 1000).toFixed(1);
    $("runtime").textContent = `onnxruntime-web ${site.ort.version} (wasm, ${threads} thread`
      + `${threads > 1 ? "s" : ""}) from ${from}; ${site.weights} weights; model loaded in ${seconds} s.`;
    $("status").textContent = "Ready: choose a photograph.";
    document.body.dataset.ready = "true";
  } catch (error) {
    showError(error.message);
    $("status").textContent = "The model could not be loaded.";
    document.body.dataset.ready = "failed";
  }
}

// The controls from the model: its decoding defaults, its layers and heads, its data terms and the examples.
function setUp() {
  const decode = manifest.spec.decode;
  $("beam").value = decode.beam_size;
  $("max-length").value = decode.max_length;
  $("max-length").max = manifest.capacity || 100;
  const { layers, heads } = manifest.attention;
  fill($("layer"), [...Array(layers).keys()].map((i) => [String(i), `${i + 1}${i === layers - 1 ? " (last)" : ""}`]),
    String(layers - 1));
  fill($("head"), [["mean", "mean of heads"], ...[...Array(heads).keys()].map((i) => [String(i), `${i + 1}`])], "mean");
  $("layer-label").hidden = layers < 2;
  $("head-label").hidden = heads < 2;
  $("terms").textContent = site.terms ? `Model data: ${site.terms}` : "";
  for (const example of site.examples) {
    const button = document.createElement("button");
    button.type = "button";
    button.className = "example";
    button.title = example.credit;
    const img = document.createElement("img");
    img.src = `examples/${example.file}`;
    img.alt = example.credit;
    button.append(img);
    button.addEventListener("click", () => captionUrl(`examples/${example.file}`, example.file));
    $("examples").append(button);
  }
  $("credits").textContent = "Examples: " + site.examples.map((e) => e.credit).join("; ") + ".";
  for (const id of ["layer", "head"]) $(id).addEventListener("change", draw);
}

function fill(select, options, value) {
  for (const [key, label] of options) select.append(new Option(label, key));
  select.value = value;
}

function options() {
  const decode = manifest.spec.decode;
  const beam = Number($("beam").value);
  const maxLength = Number($("max-length").value);
  const limit = Number($("max-length").max);
  if (!Number.isInteger(beam) || beam < 1 || beam > 10) throw new Error("beam width: a whole number from 1 to 10");
  if (!Number.isInteger(maxLength) || maxLength < 1 || maxLength > limit) {
    throw new Error(`maximum length: a whole number from 1 to ${limit}`);
  }
  return {
    beamSize: beam, maxLength, lengthPenalty: decode.length_penalty, blockTrigrams: decode.block_trigrams,
    minLength: decode.min_length, suppressBadEndings: decode.suppress_bad_endings,
  };
}

async function captionUrl(url, name) {
  const response = await fetch(url);
  await captionFile(new File([await response.blob()], name));
}

// A photograph from the file input, a drop or an example: checked, decoded for the view, captioned in the worker.
async function captionFile(file) {
  hideError();
  if (document.body.dataset.ready !== "true") return showError("the model is not loaded yet");
  if (file.size > MAX_BYTES) {
    return showError(`${file.name}: ${(file.size / 1e6).toFixed(1)} MB, over the limit of 30 MB`);
  }
  const known = headerSize(new Uint8Array(await file.slice(0, 256 * 1024).arrayBuffer()));
  try {
    if (known) checkPixels(known.width, known.height, file.name); // a decompression bomb is never decoded
  } catch (error) {
    return showError(error.message);
  }
  let bitmap;
  try {
    bitmap = await createImageBitmap(file, { imageOrientation: "from-image" });
  } catch {
    return showError(`${file.name}: not an image this browser can read`);
  }
  return run(bitmap, { kind: "caption", file, options: options() }, file.name);
}

async function run(bitmap, message, name) {
  document.body.dataset.busy = "true";
  $("status").textContent = `Captioning ${name}…`;
  try {
    const result = await ask(message);
    shown = { bitmap, result };
    selectedWord = 0;
    showCaption(result);
    $("status").textContent = `${name}: captioned in ${(result.ms / 1000).toFixed(2)} s.`;
    return result;
  } catch (error) {
    showError(error.message.includes(name) ? error.message : `${name}: ${error.message}`);
    return null;
  } finally {
    document.body.dataset.busy = "false";
  }
}

function showCaption(result) {
  const caption = $("caption");
  caption.replaceChildren();
  result.words.forEach((word, i) => {
    const button = document.createElement("button");
    button.type = "button";
    button.className = "word";
    button.textContent = word;
    button.addEventListener("click", () => select(i));
    caption.append(button, " ");
  });
  caption.dataset.tokens = result.tokens.join(" ");
  $("score").textContent = `score ${result.score.toFixed(4)} (log-probability ${result.logprob.toFixed(4)}`
    + `${result.finished ? "" : ", cut at the maximum length"})`;
  $("result").hidden = false;
  draw();
}

function select(i) {
  selectedWord = i;
  draw();
}

// The maps of the chosen layer and head (or the heads' mean): (T, h, w) as one Float32Array per word.
function wordMaps(result) {
  const [T, L, H, N] = result.attnDims;
  const layer = Number($("layer").value);
  const head = $("head").value;
  const maps = [];
  for (let t = 0; t < T; t++) {
    const map = new Float32Array(N);
    for (let h = 0; h < H; h++) {
      if (head !== "mean" && h !== Number(head)) continue;
      const offset = ((t * L + layer) * H + h) * N;
      for (let n = 0; n < N; n++) map[n] += result.attn[offset + n];
    }
    if (head === "mean") for (let n = 0; n < N; n++) map[n] /= H;
    maps.push(map);
  }
  return maps;
}

function draw() {
  if (!shown) return;
  const { bitmap, result } = shown;
  const maps = wordMaps(result);
  const scale = Math.min(1, 480 / Math.max(bitmap.width, bitmap.height));
  paint($("view"), bitmap, maps[selectedWord], result.grid, Math.round(bitmap.width * scale),
    Math.round(bitmap.height * scale));
  const strip = $("maps");
  strip.replaceChildren();
  maps.forEach((map, i) => {
    const figure = document.createElement("figure");
    figure.className = i === selectedWord ? "map selected" : "map";
    const canvas = document.createElement("canvas");
    const s = THUMB / Math.max(bitmap.width, bitmap.height);
    paint(canvas, bitmap, map, result.grid, Math.round(bitmap.width * s), Math.round(bitmap.height * s));
    const label = document.createElement("figcaption");
    label.textContent = result.words[i];
    figure.append(canvas, label);
    figure.addEventListener("click", () => select(i));
    strip.append(figure);
  });
  for (const [i, button] of [...$("caption").querySelectorAll(".word")].entries()) {
    button.classList.toggle("selected", i === selectedWord);
  }
}

// The photograph at width x height with a map (h * w) over it: scaled to its maximum, bilinearly upsampled,
// jet colours blended with weight sqrt(heat) * 0.55, as the demo's overlay.
function paint(canvas, bitmap, map, grid, width, height) {
  canvas.width = width;
  canvas.height = height;
  const context = canvas.getContext("2d");
  context.drawImage(bitmap, 0, 0, width, height);
  if (!map) return;
  const [gh, gw] = grid;
  const top = Math.max(...map, 1e-12);
  const image = context.getImageData(0, 0, width, height);
  const pixels = image.data; // (height, width, 4) RGBA
  for (let y = 0; y < height; y++) {
    const fy = Math.min(Math.max((y + 0.5) * gh / height - 0.5, 0), gh - 1);
    const y0 = Math.floor(fy);
    const y1 = Math.min(y0 + 1, gh - 1);
    const dy = fy - y0;
    for (let x = 0; x < width; x++) {
      const fx = Math.min(Math.max((x + 0.5) * gw / width - 0.5, 0), gw - 1);
      const x0 = Math.floor(fx);
      const x1 = Math.min(x0 + 1, gw - 1);
      const dx = fx - x0;
      const value = (map[y0 * gw + x0] * (1 - dx) + map[y0 * gw + x1] * dx) * (1 - dy)
        + (map[y1 * gw + x0] * (1 - dx) + map[y1 * gw + x1] * dx) * dy;
      const heat = value / top;
      const weight = Math.sqrt(Math.max(heat, 0)) * 0.55;
      const colour = jet(heat);
      const i = (y * width + x) * 4;
      for (let c = 0; c < 3; c++) pixels[i + c] = pixels[i + c] * (1 - weight) + colour[c] * weight;
    }
  }
  context.putImageData(image, 0, 0);
}

function jet(x) {
  const clip = (v) => Math.min(Math.max(v, 0), 1) * 255;
  return [clip(1.5 - Math.abs(4 * x - 3)), clip(1.5 - Math.abs(4 * x - 2)), clip(1.5 - Math.abs(4 * x - 1))];
}

function showError(text) {
  const error = $("error");
  error.textContent = text;
  error.hidden = false;
}

function hideError() {
  $("error").hidden = true;
}

$("file").addEventListener("change", (event) => event.target.files[0] && captionFile(event.target.files[0]));
const drop = $("drop");
drop.addEventListener("dragover", (event) => {
  event.preventDefault();
  drop.classList.add("over");
});
drop.addEventListener("dragleave", () => drop.classList.remove("over"));
drop.addEventListener("drop", (event) => {
  event.preventDefault();
  drop.classList.remove("over");
  if (event.dataTransfer.files[0]) captionFile(event.dataTransfer.files[0]);
});

// For scripts and tests: caption a file, or pixels already preprocessed (uint8 (3, S, S)), as the page does.
window.captioner = {
  captionFile,
  async captionPixels(pixels, overrides = {}) {
    const size = manifest.spec.preprocessing.image_size;
    const rgba = new Uint8ClampedArray(size * size * 4);
    for (let i = 0; i < size * size; i++) {
      for (let c = 0; c < 3; c++) rgba[i * 4 + c] = pixels[c * size * size + i];
      rgba[i * 4 + 3] = 255;
    }
    const bitmap = await createImageBitmap(new ImageData(rgba, size, size));
    const data = Uint8Array.from(pixels);
    return run(bitmap, { kind: "pixels", pixels: data, options: { ...options(), ...overrides } }, "pixels");
  },
};

start();
