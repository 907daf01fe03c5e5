// fun-asr web page (served by fun-asr-serve at /; docs/web.md). Plain JavaScript, no dependencies.
//  File: POST /v1/audio/transcriptions (multipart, response_format=verbose_json) through XMLHttpRequest for the
//        upload progress; the file is also decoded here (decodeAudioData) for the waveform and playback.
//  Live: the microphone through an AudioWorklet (worklet.js: 16 kHz int16) over FunASR's realtime WebSocket on
//        "/" of this server (LANGUAGE:, HOTWORDS:, SPK:true, START, binary PCM, STOP); every error event shown.
//  The API key (session storage) goes as "Authorization: Bearer" over HTTP and as ?api_key= on the WebSocket.
"use strict";

(() => {
  const $ = (id) => document.getElementById(id);
  const KEY_STORE = "fun-asr-api-key";
  const COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2"];
  const MAX_DECODE_BYTES = 64 * 1024 * 1024; // larger files get no waveform (the decoded audio would be huge)

  // ---------------------------------------------------------------- formats (as fun_asr/asr/formats.py)

  function stamp(seconds, sep) {
    let ms = Math.round(seconds * 1000);
    const h = Math.floor(ms / 3600000); ms -= h * 3600000;
    const m = Math.floor(ms / 60000); ms -= m * 60000;
    const s = Math.floor(ms / 1000); ms -= s * 1000;
    const two = (x) => String(x).padStart(2, "0");
    return `${two(h)}:${two(m)}:${two(s)}${sep}${String(ms).padStart(3, "0")}`;
  }

  function clock(seconds) { // 0:02.37, 1:02:03.04
    const t = Math.max(0, seconds);
    const h = Math.floor(t / 3600), m = Math.floor((t % 3600) / 60), s = t % 60;
    const ss = s.toFixed(2).padStart(5, "0");
    return h ? `${h}:${String(m).padStart(2, "0")}:${ss}` : `${m}:${ss}`;
  }

  // segments: [{start, end, text, speaker?}] in seconds
  function cues(segments) { return segments.filter((s) => (s.text || "").trim()); }

  function toTxt(segments, text) {
    if (!segments.some((s) => s.speaker)) return (text !== undefined ? text : segments.map((s) => s.text).join(" ")) + "\n";
    const lines = [];
    for (const s of cues(segments)) {
      const last = lines[lines.length - 1];
      if (last && last.spk === s.speaker) last.texts.push(s.text);
      else lines.push({ spk: s.speaker, texts: [s.text] });
    }
    return lines.map((l) => (l.spk ? `[${l.spk}] ` : "") + l.texts.join(" ") + "\n").join("") || "\n";
  }

  function toSrt(segments) {
    return cues(segments).map((s, i) =>
      `${i + 1}\n${stamp(s.start, ",")} --> ${stamp(s.end, ",")}\n${s.speaker ? `[${s.speaker}] ` : ""}${s.text}\n`,
    ).join("\n");
  }

  function toVtt(segments) {
    const esc = (t) => t.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
    const lines = ["WEBVTT", ""];
    for (const s of cues(segments)) {
      lines.push(`${stamp(s.start, ".")} --> ${stamp(s.end, ".")}`, s.speaker ? `<v ${s.speaker}>${esc(s.text)}` : s.text, "");
    }
    return lines.join("\n");
  }

  function download(name, body, type) {
    const url = URL.createObjectURL(new Blob([body], { type }));
    const a = document.createElement("a");
    a.href = url;
    a.download = name;
    document.body.appendChild(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 10000);
  }

  // ---------------------------------------------------------------- the API key and the server's errors

  const keyInput = $("api-key");
  function apiKey() { return keyInput.value.trim(); }
  function authHeaders() { const k = apiKey(); return k ? { Authorization: `Bearer ${k}` } : {}; }

  function wsUrl(loc, key) { // wss:// behind TLS; the key as ?api_key= (a browser cannot set WebSocket headers)
    const proto = loc.protocol === "https:" ? "wss:" : "ws:";
    return `${proto}//${loc.host}/` + (key ? `?api_key=${encodeURIComponent(key)}` : "");
  }

  function errorMessage(status, text) { // OpenAI's {"error": {"message"}}, FastAPI's {"detail"}, else the body
    try {
      const body = JSON.parse(text);
      if (body && body.error && body.error.message) return body.error.message;
      if (body && body.detail !== undefined) {
        return typeof body.detail === "string" ? body.detail
          : body.detail.map((d) => `${(d.loc || []).join(".")}: ${d.msg}`).join("; ");
      }
    } catch (_) { /* not JSON */ }
    return `HTTP ${status}${text ? `: ${text.slice(0, 300)}` : ""}`;
  }

  const serverStatus = $("server-status");
  const modelNote = $("model-note");
  let checkSeq = 0;
  async function checkServer() { // GET /v1/models: the model id, the demo note, whether the key is accepted
    const seq = ++checkSeq;
    try {
      const r = await fetch("/v1/models", { headers: authHeaders(), cache: "no-store" });
      if (seq !== checkSeq) return null;
      const text = await r.text();
      if (r.ok) {
        const model = (JSON.parse(text).data || [{}])[0] || {};
        serverStatus.textContent = `Server ready · model ${model.id}`;
        // the 20-word demo model (-m demo): say so where everyone sees it, with what it knows
        modelNote.textContent = model.demo ? model.description || "This server runs the 20-word demo model." : "";
        modelNote.hidden = !model.demo;
        serverStatus.className = "muted";
        keyInput.removeAttribute("aria-invalid");
        return null;
      }
      const msg = errorMessage(r.status, text);
      serverStatus.textContent = r.status === 401
        ? (apiKey() ? `The API key was refused: ${msg}` : `This server needs an API key: enter it above. (${msg})`)
        : `Server error: ${msg}`;
      serverStatus.className = "warn";
      if (r.status === 401) keyInput.setAttribute("aria-invalid", "true");
      return msg;
    } catch (e) {
      if (seq !== checkSeq) return null;
      serverStatus.textContent = `The server cannot be reached (${e.message || e}).`;
      serverStatus.className = "warn";
      return serverStatus.textContent;
    }
  }

  keyInput.value = sessionStorage.getItem(KEY_STORE) || "";
  let keyTimer = 0;
  keyInput.addEventListener("input", () => {
    const k = apiKey();
    if (k) sessionStorage.setItem(KEY_STORE, k); else sessionStorage.removeItem(KEY_STORE);
    clearTimeout(keyTimer);
    keyTimer = setTimeout(checkServer, 300);
  });

  // ---------------------------------------------------------------- tabs (arrow keys move between them)

  const tabs = [$("tab-file"), $("tab-live")];
  function selectTab(tab, focus) {
    for (const t of tabs) {
      const on = t === tab;
      t.setAttribute("aria-selected", String(on));
      t.tabIndex = on ? 0 : -1;
      $(t.getAttribute("aria-controls")).hidden = !on;
    }
    if (focus) tab.focus();
    history.replaceState(null, "", tab.id === "tab-live" ? "#live" : "#file");
    if (tab.id === "tab-file") drawWave();
  }
  tabs.forEach((t, i) => {
    t.addEventListener("click", () => selectTab(t, false));
    t.addEventListener("keydown", (e) => {
      const to = { ArrowRight: i + 1, ArrowLeft: i - 1, Home: 0, End: tabs.length - 1 }[e.key];
      if (to === undefined) return;
      e.preventDefault();
      selectTab(tabs[(to + tabs.length) % tabs.length], true);
    });
  });

  // ---------------------------------------------------------------- File

  const file = { blob: null, audio: null, result: null, segments: [], xhr: null, timer: 0, player: null };
  const fileInput = $("file-input"), drop = $("drop"), goButton = $("file-go"), cancelButton = $("file-cancel");
  const progressBox = $("file-progress"), progressBar = $("file-progress-bar"), progressLabel = $("file-progress-label");
  const fileError = $("file-error");

  function showFileError(msg) {
    fileError.textContent = msg;
    fileError.hidden = !msg;
  }

  function sizeText(n) {
    return n >= 1048576 ? `${(n / 1048576).toFixed(1)} MB` : n >= 1024 ? `${(n / 1024).toFixed(0)} kB` : `${n} bytes`;
  }

  async function chooseFile(blob) {
    stopPlayback();
    file.blob = blob;
    file.audio = null;
    file.result = null;
    $("file-result").hidden = true;
    showFileError("");
    goButton.disabled = false;
    $("drop-text").textContent = blob.name;
    const info = $("file-info");
    info.textContent = `${blob.name} · ${sizeText(blob.size)}`;
    if (blob.size > MAX_DECODE_BYTES) {
      $("wave-note").textContent = `No waveform or playback: the file is over ${sizeText(MAX_DECODE_BYTES)}.`;
      return;
    }
    try { // the browser's own decoder, for the waveform and playback (the server decodes the upload itself)
      const data = await blob.arrayBuffer();
      const ctx = new OfflineAudioContext(1, 1, 16000);
      const audio = await ctx.decodeAudioData(data);
      if (file.blob !== blob) return;
      file.audio = audio;
      info.textContent = `${blob.name} · ${sizeText(blob.size)} · ${clock(audio.duration)}`;
      $("wave-note").textContent = "Click the waveform or a segment to play it.";
    } catch (_) {
      if (file.blob !== blob) return;
      $("wave-note").textContent = "This browser cannot decode the file: no waveform or playback (the server may still read it).";
    }
    if (file.result) drawWave();
  }

  fileInput.addEventListener("change", () => { if (fileInput.files[0]) chooseFile(fileInput.files[0]); });
  for (const ev of ["dragenter", "dragover"]) {
    drop.addEventListener(ev, (e) => { e.preventDefault(); drop.classList.add("over"); });
  }
  for (const ev of ["dragleave", "drop"]) drop.addEventListener(ev, () => drop.classList.remove("over"));
  drop.addEventListener("drop", (e) => {
    e.preventDefault();
    const f = e.dataTransfer && e.dataTransfer.files[0];
    if (f) chooseFile(f);
  });
  // a file dropped anywhere else would make the browser navigate away to it
  window.addEventListener("dragover", (e) => e.preventDefault());
  window.addEventListener("drop", (e) => e.preventDefault());

  function setProgress(label, value) {
    progressBox.hidden = false;
    progressLabel.textContent = label;
    if (value === null) progressBar.removeAttribute("value"); else progressBar.value = value;
  }

  function endRequest() {
    clearInterval(file.timer);
    file.xhr = null;
    progressBox.hidden = true;
    cancelButton.hidden = true;
    goButton.disabled = !file.blob;
  }

  function transcribe() {
    if (!file.blob || file.xhr) return;
    stopPlayback();
    showFileError("");
    $("file-result").hidden = true;
    const form = new FormData();
    form.append("file", file.blob, file.blob.name || "audio");
    form.append("response_format", "verbose_json");
    const lang = $("file-language").value.trim();
    if (lang && lang.toLowerCase() !== "auto") form.append("language", lang);
    form.append("itn", $("file-itn").checked ? "true" : "false");
    const hot = $("file-hotwords").value.trim();
    if (hot) form.append("hotwords", hot);
    if ($("file-spk").checked) form.append("spk", "true");

    const xhr = new XMLHttpRequest();
    file.xhr = xhr;
    xhr.open("POST", "/v1/audio/transcriptions");
    for (const [k, v] of Object.entries(authHeaders())) xhr.setRequestHeader(k, v);
    goButton.disabled = true;
    cancelButton.hidden = false;
    setProgress("Uploading… 0%", 0);
    let sent = 0;
    xhr.upload.onprogress = (e) => {
      if (!e.lengthComputable) return;
      const pct = Math.round((100 * e.loaded) / e.total);
      setProgress(`Uploading… ${pct}% of ${sizeText(e.total)}`, pct);
    };
    xhr.upload.onload = () => { // the server has the file: it decodes and transcribes it, then answers
      sent = performance.now();
      const tick = () => {
        const dur = file.audio ? ` ${clock(file.audio.duration)} of audio` : "";
        setProgress(`Transcribing${dur}… ${((performance.now() - sent) / 1000).toFixed(1)} s`, null);
      };
      tick();
      file.timer = setInterval(tick, 100);
    };
    xhr.onload = () => {
      endRequest();
      if (xhr.status !== 200) {
        showFileError(`The server refused the file (HTTP ${xhr.status}): ${errorMessage(xhr.status, xhr.responseText)}`);
        if (xhr.status === 401) checkServer();
        return;
      }
      try {
        showResult(JSON.parse(xhr.responseText), sent ? (performance.now() - sent) / 1000 : null);
      } catch (e) {
        showFileError(`Unexpected answer from the server: ${e.message}`);
      }
    };
    xhr.onerror = () => { endRequest(); showFileError("The upload failed: the server cannot be reached (network error)."); };
    xhr.onabort = () => { endRequest(); showFileError("Cancelled."); };
    xhr.send(form);
  }
  goButton.addEventListener("click", transcribe);
  cancelButton.addEventListener("click", () => { if (file.xhr) file.xhr.abort(); });

  function speakerColour(label) {
    const m = /(\d+)$/.exec(label || "");
    return COLOURS[m ? Number(m[1]) % COLOURS.length : 0];
  }

  function speakerBadge(label) {
    const b = document.createElement("span");
    b.className = "spk";
    b.textContent = label;
    b.style.background = speakerColour(label);
    return b;
  }

  // a segment's times, its speaker (when known) and its text, appended to `el`
  function appendSegment(el, s) {
    const t = document.createElement("span");
    t.className = "time";
    t.textContent = `${clock(s.start)} – ${clock(s.end)}`;
    el.append(t);
    if (s.speaker) el.append(speakerBadge(s.speaker));
    const x = document.createElement("span");
    x.className = "seg-text";
    const below = threshold();
    if (s.words && s.words.length) {
      // each word with the decoder's probability; those under the threshold marked (class "low")
      for (const w of s.words) {
        const body = w.word.trimStart();  // (the white space before a word stays outside its mark)
        if (body.length < w.word.length) x.append(w.word.slice(0, w.word.length - body.length));
        const span = document.createElement("span");
        span.className = w.probability < below ? "word low" : "word";
        span.textContent = body;
        span.title = `probability ${w.probability.toFixed(2)}`;
        x.append(span);
      }
    } else {
      x.textContent = s.text;
      if (s.confidence !== undefined && s.confidence !== null) {
        x.title = `confidence ${s.confidence.toFixed(2)}`;
        if (s.confidence < below) x.classList.add("low");
      }
    }
    el.append(x);
  }

  // the probability under which a word (a live sentence: its confidence) is marked
  function threshold() {
    const v = Number($("conf-threshold").value);
    return Number.isFinite(v) ? v : 0.5;
  }

  function showResult(result, seconds) {
    file.result = result;
    file.segments = (result.segments || []).map((s) => ({ start: s.start, end: s.end, text: s.text, speaker: s.speaker,
      words: s.token_words }));
    const speakers = new Set(file.segments.filter((s) => s.speaker).map((s) => s.speaker));
    const parts = [result.language, `${clock(result.duration || 0)} of audio`];
    if (seconds !== null) parts.push(`transcribed in ${seconds.toFixed(1)} s`);
    parts.push(`${file.segments.length} segment${file.segments.length === 1 ? "" : "s"}`);
    if (speakers.size) parts.push(`${speakers.size} speaker${speakers.size === 1 ? "" : "s"}`);
    $("file-summary").textContent = parts.join(" · ");
    const warnings = $("file-warnings");
    warnings.replaceChildren(...(result.warnings || []).map((w) => {
      const li = document.createElement("li");
      li.textContent = w;
      return li;
    }));
    $("file-text").textContent = result.text || "(no speech found)";
    renderSegments();
    $("file-result").hidden = false;
    drawWave();
  }

  function renderSegments() {
    const list = $("segments");
    list.replaceChildren(...file.segments.map((s, i) => {
      const li = document.createElement("li");
      const b = document.createElement("button");
      b.className = "seg";
      b.dataset.i = String(i);
      appendSegment(b, s);
      b.setAttribute("aria-label", `play ${clock(s.start)} to ${clock(s.end)}${s.speaker ? `, ${s.speaker}` : ""}: ${s.text}`);
      b.addEventListener("click", () => play(s.start, s.end, i));
      li.append(b);
      return li;
    }));
  }

  // the waveform (min/max per pixel column) over the segments, one colour per speaker, and the playhead
  const canvas = $("wave");
  let peaks = null; // {width, min: Float32Array, max: Float32Array} for the current audio
  function drawWave(playhead) {
    if (!file.result || $("panel-file").hidden) return;
    const css = canvas.clientWidth || 600, h = 120, dpr = window.devicePixelRatio || 1;
    if (canvas.width !== Math.round(css * dpr)) { canvas.width = Math.round(css * dpr); canvas.height = h * dpr; peaks = null; }
    const g = canvas.getContext("2d");
    g.setTransform(dpr, 0, 0, dpr, 0, 0);
    const dur = (file.audio && file.audio.duration) || file.result.duration || 1;
    const x = (t) => (t / dur) * css;
    const dark = matchMedia("(prefers-color-scheme: dark)").matches;
    g.fillStyle = dark ? "#1b1e23" : "#f4f6f8";
    g.fillRect(0, 0, css, h);
    for (const s of file.segments) {
      g.globalAlpha = 0.28;
      g.fillStyle = speakerColour(s.speaker);
      g.fillRect(x(s.start), 0, Math.max(1, x(s.end) - x(s.start)), h - 14);
      g.globalAlpha = 1;
      g.fillRect(x(s.start), h - 14, Math.max(1, x(s.end) - x(s.start)), 6);
    }
    if (file.audio) {
      if (!peaks || peaks.width !== Math.floor(css)) peaks = computePeaks(file.audio, Math.floor(css));
      g.fillStyle = dark ? "#d8dde3" : "#30363d";
      const mid = (h - 14) / 2, gain = 0.95 / Math.max(peaks.top, 0.02); // quiet files fill the height too
      for (let i = 0; i < peaks.width; i++) {
        const top = mid - peaks.max[i] * gain * mid, bottom = mid - peaks.min[i] * gain * mid;
        g.fillRect(i, top, 1, Math.max(1, bottom - top));
      }
    }
    g.fillStyle = dark ? "#9aa4ae" : "#57606a";
    g.font = "10px system-ui, sans-serif";
    const stepS = [0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 1800, 3600].find((s) => (s / dur) * css >= 60) || 7200;
    for (let t = 0; t <= dur; t += stepS) g.fillText(clock(t).replace(/\.00$/, ""), x(t) + 2, h - 1);
    if (playhead !== undefined) {
      g.fillStyle = "#e5534b";
      g.fillRect(x(playhead) - 1, 0, 2, h - 14);
    }
  }

  function computePeaks(audio, width) {
    const data = audio.getChannelData(0), n = data.length;
    const min = new Float32Array(width), max = new Float32Array(width);
    let top = 0;
    for (let i = 0; i < width; i++) {
      const a = Math.floor((i * n) / width), b = Math.max(a + 1, Math.floor(((i + 1) * n) / width));
      let lo = 0, hi = 0;
      for (let j = a; j < b && j < n; j++) { const v = data[j]; if (v < lo) lo = v; if (v > hi) hi = v; }
      min[i] = lo; max[i] = hi;
      top = Math.max(top, hi, -lo);
    }
    return { width, min, max, top };
  }
  window.addEventListener("resize", () => drawWave());

  let playCtx = null;
  function stopPlayback() {
    if (file.player) {
      const p = file.player;
      file.player = null;
      try { p.source.stop(); } catch (_) { /* already ended */ }
      cancelAnimationFrame(p.frame);
    }
    for (const b of document.querySelectorAll(".seg[aria-current]")) b.removeAttribute("aria-current");
    $("play-stop").disabled = true;
    drawWave();
  }

  function play(start, end, index) {
    if (!file.audio) {
      $("wave-note").textContent = "No playback: this browser could not decode the file.";
      return;
    }
    stopPlayback();
    playCtx = playCtx || new AudioContext();
    playCtx.resume();
    const source = playCtx.createBufferSource();
    source.buffer = file.audio;
    source.connect(playCtx.destination);
    const from = Math.max(0, start), length = Math.max(0.05, end - from);
    source.start(0, from, length);
    const t0 = playCtx.currentTime;
    const player = { source, frame: 0 };
    file.player = player;
    if (index !== undefined) document.querySelector(`.seg[data-i="${index}"]`).setAttribute("aria-current", "true");
    $("play-stop").disabled = false;
    const frame = () => {
      if (file.player !== player) return;
      drawWave(from + Math.min(length, playCtx.currentTime - t0));
      player.frame = requestAnimationFrame(frame);
    };
    frame();
    source.onended = () => { if (file.player === player) stopPlayback(); };
  }

  canvas.addEventListener("click", (e) => {
    if (!file.result) return;
    const r = canvas.getBoundingClientRect();
    const dur = (file.audio && file.audio.duration) || file.result.duration || 1;
    const t = ((e.clientX - r.left) / r.width) * dur;
    const i = file.segments.findIndex((s) => s.start <= t && t <= s.end);
    if (i >= 0) play(file.segments[i].start, file.segments[i].end, i);
    else play(t, dur);
  });
  $("play-all").addEventListener("click", () => play(0, file.audio ? file.audio.duration : 0));
  $("play-stop").addEventListener("click", stopPlayback);
  $("conf-threshold").addEventListener("input", () => {
    $("conf-value").textContent = threshold().toFixed(2);
    if (file.result) renderSegments();
    if (live.sentences.length) renderLive();
  });

  // ---------------------------------------------------------------- Live

  const live = { ws: null, ctx: null, stream: null, node: null, sentences: [], partial: "", stopping: null,
    sentSamples: 0, opened: false, ownClose: false, startedAt: 0 };
  const startButton = $("live-start"), stopButton = $("live-stop"), liveStatus = $("live-status");

  function liveError(msg, kind) { // kind "notice": a server notice (shown with the errors, marked as a notice)
    const li = document.createElement("li");
    li.textContent = msg;
    if (kind) li.className = kind;
    $("live-errors").append(li);
  }

  function liveEvent(text) {
    const li = document.createElement("li");
    li.textContent = text;
    $("live-events").append(li);
  }

  function liveSegments() {
    return live.sentences.map((s) => ({ start: s.start / 1000, end: s.end / 1000, text: s.text,
      speaker: s.spk === undefined || s.spk === null ? undefined : `SPK${s.spk}`, confidence: s.confidence }));
  }

  function renderLive() {
    const list = $("live-sentences");
    list.replaceChildren(...liveSegments().map((s) => {
      const li = document.createElement("li");
      li.className = "sentence";
      appendSegment(li, s);
      return li;
    }));
    $("live-partial").textContent = live.partial;
    for (const b of document.querySelectorAll('.dl[data-src="live"]')) b.disabled = live.sentences.length === 0;
  }

  function onLiveMessage(e) {
    if (typeof e.data !== "string") return;
    let msg;
    try { msg = JSON.parse(e.data); } catch (_) { liveError(`unreadable message from the server: ${e.data.slice(0, 200)}`); return; }
    if (msg.event === "error") { liveError(msg.error); liveEvent(`error: ${msg.error}`); return; }
    if (msg.event) {
      const rest = Object.entries(msg).filter(([k]) => k !== "event").map(([k, v]) => `${k}=${JSON.stringify(v)}`);
      liveEvent(`${msg.event}${rest.length ? ` ${rest.join(" ")}` : ""}`);
      if (msg.event === "stopped" && live.stopping) live.stopping();
      return;
    }
    if (msg.notice) liveError(msg.notice, "notice");
    if (Array.isArray(msg.sentences)) live.sentences = msg.sentences;
    live.partial = msg.is_final ? "" : (msg.partial || "");
    renderLive();
  }

  function level(peak) { // 0..1 over -60..0 dBFS
    return peak > 0 ? Math.max(0, Math.min(1, 1 + (20 * Math.log10(peak)) / 60)) : 0;
  }

  async function cleanupAudio() {
    if (live.node) { live.node.port.postMessage("stop"); live.node.disconnect(); live.node = null; }
    if (live.stream) { for (const t of live.stream.getTracks()) t.stop(); live.stream = null; }
    if (live.ctx) { const c = live.ctx; live.ctx = null; try { await c.close(); } catch (_) { /* closed */ } }
    $("live-level").value = 0;
  }

  function liveIdle(status) {
    startButton.disabled = false;
    stopButton.disabled = true;
    liveStatus.textContent = status;
  }

  async function startLive() {
    if (live.ws) return;
    startButton.disabled = true;
    $("live-errors").replaceChildren();
    $("live-events").replaceChildren();
    live.sentences = [];
    live.partial = "";
    renderLive();
    if (!window.isSecureContext || !navigator.mediaDevices || !window.AudioWorkletNode) {
      liveError("The microphone needs a secure page: open it as https:// (fun-asr-serve --ssl-certfile) or on " +
        "localhost, in a browser with AudioWorklet.");
      return liveIdle("Not recording.");
    }
    liveStatus.textContent = "Checking the server…";
    const refused = await checkServer();
    if (refused) { liveError(refused); return liveIdle("Not recording."); }
    try {
      liveStatus.textContent = "Opening the microphone…";
      live.stream = await navigator.mediaDevices.getUserMedia({
        audio: { channelCount: 1, echoCancellation: false, noiseSuppression: false, autoGainControl: false } });
      live.ctx = new AudioContext();
      await live.ctx.audioWorklet.addModule("/web/worklet.js");
      const source = live.ctx.createMediaStreamSource(live.stream);
      live.node = new AudioWorkletNode(live.ctx, "pcm16k", { numberOfOutputs: 1, processorOptions: { chunk: 1600 } });
      const mute = live.ctx.createGain();
      mute.gain.value = 0; // keeps the graph pulling the worklet; nothing is played back
      source.connect(live.node).connect(mute).connect(live.ctx.destination);
    } catch (e) {
      liveError(`The microphone could not be opened: ${e.message || e.name || e}`);
      await cleanupAudio();
      return liveIdle("Not recording.");
    }
    connect();
  }

  function connect() {
    const ws = new WebSocket(wsUrl(location, apiKey()));
    ws.binaryType = "arraybuffer";
    live.ws = ws;
    live.opened = false;
    live.ownClose = false;
    live.sentSamples = 0;
    liveStatus.textContent = "Connecting…";
    ws.onopen = () => {
      live.opened = true;
      const lang = $("live-language").value.trim();
      if (lang && lang.toLowerCase() !== "auto") ws.send(`LANGUAGE:${lang}`);
      const hot = $("live-hotwords").value.trim();
      if (hot) ws.send(`HOTWORDS:${hot}`);
      if ($("live-spk").checked) ws.send("SPK:true");
      ws.send("START");
      live.startedAt = performance.now();
      stopButton.disabled = false;
      live.node.port.onmessage = (m) => {
        if (m.data.flushed) { if (live.onFlushed) live.onFlushed(); return; }
        $("live-level").value = level(m.data.peak);
        if (ws.readyState === WebSocket.OPEN && !live.stopping) {
          ws.send(m.data.pcm);
          live.sentSamples += m.data.pcm.byteLength / 2;
          liveStatus.textContent = `Recording · ${(live.sentSamples / 16000).toFixed(1)} s sent`;
        }
      };
    };
    ws.onmessage = onLiveMessage;
    ws.onerror = () => { /* onclose says what happened */ };
    ws.onclose = (e) => {
      const own = live.ownClose;
      live.ws = null;
      if (live.stopping) live.stopping();
      cleanupAudio();
      if (!live.opened) {
        liveError(`The server refused the WebSocket connection to ${wsUrl(location, "")} (close code ${e.code}): ` +
          "a missing or wrong API key is refused this way, as is a server that is down.");
      } else if (!own) {
        liveError(`The connection closed (code ${e.code}${e.reason ? `: ${e.reason}` : ""}).`);
      }
      liveIdle(`Not recording.${live.sentences.length ? ` ${live.sentences.length} sentences.` : ""}`);
    };
  }

  async function stopLive() {
    const ws = live.ws;
    if (!ws || live.stopping) return;
    stopButton.disabled = true;
    liveStatus.textContent = "Stopping: waiting for the final result…";
    if (live.node) { // the audio the worklet still holds goes first
      await new Promise((resolve) => {
        live.onFlushed = resolve;
        live.node.port.postMessage("flush");
        setTimeout(resolve, 500);
      });
      live.onFlushed = null;
    }
    const done = new Promise((resolve) => { live.stopping = resolve; });
    await cleanupAudio();
    if (ws.readyState === WebSocket.OPEN) ws.send("STOP");
    const timeout = new Promise((resolve) => setTimeout(() => resolve("timeout"), 120000));
    if ((await Promise.race([done, timeout])) === "timeout") liveError("No final result within 120 s; closing.");
    live.stopping = null;
    live.ownClose = true;
    if (ws.readyState === WebSocket.OPEN) ws.close(1000, "done");
  }

  startButton.addEventListener("click", startLive);
  stopButton.addEventListener("click", stopLive);

  // ---------------------------------------------------------------- downloads

  for (const b of document.querySelectorAll(".dl")) {
    b.addEventListener("click", () => {
      const fromFile = b.dataset.src === "file";
      if (fromFile && !file.result) return;
      const segs = fromFile ? file.segments : liveSegments();
      const base = fromFile ? (file.blob.name || "audio").replace(/\.[^.]*$/, "") : "live";
      const fmt = b.dataset.fmt;
      const json = fromFile ? file.result : { text: toTxt(segs).trim(), segments: segs };
      const body = fmt === "txt" ? toTxt(segs, fromFile ? file.result.text : undefined) : fmt === "srt" ? toSrt(segs)
        : fmt === "vtt" ? toVtt(segs) : JSON.stringify(json, null, 2) + "\n";
      const type = { txt: "text/plain", srt: "application/x-subrip", vtt: "text/vtt", json: "application/json" }[fmt];
      download(`${base}.${fmt}`, body, `${type};charset=utf-8`);
    });
  }

  // ---------------------------------------------------------------- start

  selectTab(location.hash === "#live" ? tabs[1] : tabs[0], false);
  checkServer();
  window.FunAsrWeb = { wsUrl, toTxt, toSrt, toVtt, stamp, errorMessage }; // for tests and the console
})();
