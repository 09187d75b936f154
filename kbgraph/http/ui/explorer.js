// kbgraph explorer: what an agent gets from graph_context, drawn. Every call goes to this
// service's API with the token typed in (kept in sessionStorage: this tab only), so the page
// shows exactly what that token may see. Text is always set with textContent, never as HTML.
"use strict";
(() => {
  const $ = (id) => document.getElementById(id);
  const state = {
    token: sessionStorage.getItem("kbgraph.token") || "",
    kb: "", seq: null, answer: null, lastAsk: null, selected: null, pathFrom: null,
  };
  // Each ask and each concept shown gets a number; an answer that arrives after a newer
  // request was made is dropped, so a slow reply never overwrites what was asked later.
  const latest = { ask: 0, concept: 0 };
  let cy = null;
  let rings = [];

  async function api(method, path, body) {
    const headers = { Authorization: `Bearer ${state.token}` };
    if (body !== undefined) headers["Content-Type"] = "application/json";
    const response = await fetch(path, {
      method, headers, body: body === undefined ? undefined : JSON.stringify(body),
    });
    let data = null;
    try { data = await response.json(); } catch { data = null; }
    if (!response.ok) {
      throw new Error(data && data.error ? data.error : `${response.status} ${response.statusText}`);
    }
    return { data, seq: response.headers.get("X-KB-Seq") };
  }

  function showError(message) {
    const box = $("error");
    box.textContent = message || "";
    box.hidden = !message;
  }

  const kbPath = (rest) => `/v1/kbs/${encodeURIComponent(state.kb)}${rest}`;
  // The whole id is one path segment ("/" as %2F): a browser removes "." and ".." segments,
  // encoded or not, so an id's "../../other/concepts/x" must never become segments. An id
  // that is "." or ".." alone cannot be put in a path at all.
  function conceptPath(id) {
    if (id === "." || id === "..") throw new Error(`concept id "${id}" cannot be opened here`);
    return kbPath(`/concepts/${encodeURIComponent(id)}`);
  }
  const label = (item) => item.title || item.id;

  function el(tag, text, className) {
    const node = document.createElement(tag);
    if (text !== undefined) node.textContent = text;
    if (className) node.className = className;
    return node;
  }

  async function loadKBs() {
    const { data } = await api("GET", "/v1/kbs");
    const select = $("kb");
    select.replaceChildren();
    for (const kb of data.kbs) {
      const vectors = kb.vectors && kb.vectors !== "off" ? `, vectors ${kb.vectors}` : "";
      const option = el("option", `${kb.kb} (${kb.concepts} concepts, ${kb.links} links${vectors})`);
      option.value = kb.kb;
      select.append(option);
    }
    select.disabled = data.kbs.length === 0;
    $("ask-button").disabled = data.kbs.length === 0;
    $("search-button").disabled = data.kbs.length === 0;
    state.kb = select.value;
    showError(data.kbs.length ? "" : "This token sees no KB.");
  }

  function askBody() {
    const body = {};
    const query = $("query").value.trim();
    if (query) body.query = query;
    const ids = $("ids").value.split(",").map((s) => s.trim()).filter(Boolean);
    if (ids.length) body.ids = ids;
    const limit = parseInt($("limit").value, 10);
    if (limit) body.limit = limit;
    return body;
  }

  async function ask(body) {
    const mine = ++latest.ask;
    const { data, seq } = await api("POST", kbPath("/tools/graph_context"), body);
    if (mine !== latest.ask) return;
    state.lastAsk = body;
    state.answer = data;
    state.seq = seq;
    renderAnswer(data);
    renderGraph(data);
    const note = data.note ? ` (${data.note})` : "";
    $("status").textContent =
      `KB ${state.kb} at seq ${seq}: ${data.ranked.length} ranked (${data.seeds.length} seeds, ${data.count} results)${note}`;
  }

  // Plain search (GET search, with the chosen mode): the hits listed, nothing drawn.
  async function searchHits() {
    const query = $("query").value.trim();
    if (!query) throw new Error("type a question to search for");
    const params = new URLSearchParams({ q: query });
    const limit = parseInt($("limit").value, 10);
    if (limit) params.set("limit", String(limit));
    if ($("mode").value) params.set("mode", $("mode").value);
    const mine = ++latest.ask;
    const { data, seq } = await api("GET", kbPath(`/search?${params}`));
    if (mine !== latest.ask) return;
    const list = $("answer");
    list.replaceChildren();
    list.dataset.renders = String(Number(list.dataset.renders || 0) + 1);
    for (const hit of data.hits) {
      const item = el("li");
      item.dataset.id = hit.id;
      item.dataset.kind = "hit";
      const button = el("button", undefined, "item");
      button.type = "button";
      button.append(el("span", label(hit), "title"));
      button.append(el("span", `score ${hit.score.toFixed(4)}`, "meta"));
      if (hit.snippet) button.append(el("span", hit.snippet, "snippet"));
      button.addEventListener("click", () => showConcept(hit.id));
      item.append(button);
      list.append(item);
    }
    $("status").textContent = `KB ${state.kb} at seq ${seq}: ${data.count} search hits`;
  }

  function renderAnswer(data) {
    const list = $("answer");
    list.replaceChildren();
    list.dataset.renders = String(Number(list.dataset.renders || 0) + 1);  // each answer shown
    // The list is `ranked`, the order an agent reads: seeds (hops 0) and results blended.
    const weights = new Map(data.seeds.map((s) => [s.id, s.weight]));
    const rows = data.ranked.map((r) => ({ ...r, kind: r.hops === 0 ? "seed" : "result" }));
    for (const row of rows) {
      const item = el("li");
      item.dataset.id = row.id;
      item.dataset.kind = row.kind;
      const button = el("button", undefined, "item");
      button.type = "button";
      button.append(el("span", label(row), "title"));
      if (row.kind === "seed") button.append(el("span", "seed", "seed-badge"));
      const meta = row.kind === "seed"
        ? `score ${row.score.toFixed(4)} · weight ${weights.get(row.id).toFixed(4)}`
        : `score ${row.score.toFixed(4)} · hops ${row.hops} · via ${row.via}${row.by === "mention" ? " · by mention" : ""}`;
      button.append(el("span", meta, "meta"));
      if (row.snippet) button.append(el("span", row.snippet, "snippet"));
      button.addEventListener("click", () => showConcept(row.id));
      item.append(button);
      list.append(item);
    }
  }

  function renderGraph(data) {
    const nodes = new Map();
    const maxScore = Math.max(1e-9, ...data.seeds.map((s) => s.score), ...data.results.map((r) => r.score));
    const size = (score) => 18 + 46 * Math.sqrt(Math.max(0, score) / maxScore);
    for (const s of data.seeds) nodes.set(s.id, { id: s.id, label: label(s), hops: 0, kind: "seed", size: size(s.score) });
    for (const r of data.results) {
      nodes.set(r.id, { id: r.id, label: label(r), hops: r.hops, kind: "result", size: size(r.score) });
    }
    // `ranked` may hold concepts the walk over mentions reached that `results` does not
    const reached = data.ranked.filter((r) => r.hops > 0 && !nodes.has(r.id));
    for (const r of reached) nodes.set(r.id, { id: r.id, label: label(r), hops: r.hops, kind: "result", size: size(0) });
    const edges = [];
    const viaOf = new Map();
    for (const r of [...data.results, ...reached]) {
      if (r.via && r.via !== r.id && !viaOf.has(r.id)) {
        viaOf.set(r.id, r.via);
        if (!nodes.has(r.via)) nodes.set(r.via, { id: r.via, label: r.via, hops: Math.max(0, r.hops - 1), kind: "context", size: 12 });
        edges.push({ data: { id: `via:${r.via}->${r.id}`, source: r.via, target: r.id }, classes: r.by === "mention" ? "mention" : "" });
      }
    }
    // Each ring in the order of the ring inside it (a node beside the one it was reached via),
    // so the via edges run outwards rather than across the picture.
    const levels = new Map();
    for (const n of nodes.values()) levels.set(n.hops, [...(levels.get(n.hops) || []), n]);
    const rank = new Map();
    const ordered = [];
    for (const hops of [...levels.keys()].sort((a, b) => a - b)) {
      const ring = levels.get(hops);
      const key = (n) => (rank.has(viaOf.get(n.id)) ? rank.get(viaOf.get(n.id)) : ring.length);
      if (hops > 0) ring.sort((a, b) => key(a) - key(b) || (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
      ring.forEach((n, i) => rank.set(n.id, i));
      ordered.push(...ring);
    }
    const maxHops = Math.max(0, ...levels.keys());
    const fullest = Math.max(1, ...[...levels.values()].map((ring) => ring.length));
    const elements = [...ordered.map((n) => ({ data: n, classes: n.kind })), ...edges];
    if (cy) cy.destroy();
    cy = cytoscape({
      container: $("graph"),
      elements,
      style: [
        { selector: "node", style: { label: "data(label)", width: "data(size)", height: "data(size)",
          "font-size": 13, "text-valign": "bottom", "text-margin-y": 3, "text-wrap": "wrap",
          "text-max-width": 110, "line-height": 1.1, color: "#1f2937", "background-color": "#1d4ed8" } },
        { selector: "node.seed", style: { "background-color": "#c2410c" } },
        { selector: "node.context", style: { "background-color": "#cbd5e1" } },
        { selector: "node:selected", style: { "border-width": 3, "border-color": "#f59e0b" } },
        { selector: "edge", style: { width: 1.5, "line-color": "#94a3b8", "curve-style": "bezier",
          "target-arrow-shape": "triangle", "target-arrow-color": "#94a3b8" } },
        { selector: "edge.mention", style: { "line-style": "dashed" } },
        { selector: ".path", style: { "line-color": "#16a34a", "target-arrow-color": "#16a34a", width: 4,
          "border-width": 3, "border-color": "#16a34a" } },
      ],
      // One ring per hop count, seeds in the middle. Every ring starts half a step of the
      // fullest ring past the top, so the top of each ring is free for its "N hops" label.
      layout: { name: "concentric", concentric: (n) => maxHops - n.data("hops"), levelWidth: () => 1,
                minNodeSpacing: 16, nodeDimensionsIncludeLabels: true, animate: false, padding: 24,
                startAngle: (3 / 2) * Math.PI + Math.PI / fullest },
    });
    cy.on("tap", "node", (event) => showConcept(event.target.id()));
    measureRings(maxHops);
    cy.on("render", drawRings);
  }

  function measureRings(maxHops) {
    const centre = cy.nodes(".seed").length ? cy.nodes(".seed") : cy.nodes();
    const box = centre.boundingBox();
    const c = { x: (box.x1 + box.x2) / 2, y: (box.y1 + box.y2) / 2 };
    rings = [];
    for (let hops = 1; hops <= maxHops; hops += 1) {
      const ring = cy.nodes().filter((n) => n.data("hops") === hops);
      if (!ring.length) continue;
      const r = Math.max(...ring.map((n) => Math.hypot(n.position("x") - c.x, n.position("y") - c.y)));
      rings.push({ hops, x: c.x, y: c.y, r });
    }
  }

  function drawRings() {
    const container = $("graph");
    let canvas = container.querySelector("canvas.rings");
    if (!canvas) {
      canvas = el("canvas", undefined, "rings");
      canvas.style.position = "absolute";
      canvas.style.left = "0";
      canvas.style.top = "0";
      canvas.style.pointerEvents = "none";
      container.prepend(canvas);  // under the graph: rings never cover a node
    }
    canvas.width = container.clientWidth;
    canvas.height = container.clientHeight;
    const g = canvas.getContext("2d");
    const zoom = cy.zoom();
    const pan = cy.pan();
    g.clearRect(0, 0, canvas.width, canvas.height);
    g.font = "11px system-ui, sans-serif";
    g.textAlign = "center";
    g.textBaseline = "middle";
    for (const ring of rings) {
      const x = ring.x * zoom + pan.x;
      const y = ring.y * zoom + pan.y;
      g.strokeStyle = "rgba(100,116,139,0.35)";
      g.setLineDash([4, 4]);
      g.beginPath();
      g.arc(x, y, ring.r * zoom, 0, 2 * Math.PI);
      g.stroke();
      const text = `${ring.hops} hop${ring.hops > 1 ? "s" : ""}`;
      const w = g.measureText(text).width + 8;
      g.fillStyle = "rgba(255,255,255,0.9)";
      g.fillRect(x - w / 2, y - ring.r * zoom - 8, w, 16);
      g.fillStyle = "rgba(71,85,105,1)";
      g.fillText(text, x, y - ring.r * zoom);
    }
  }

  async function showConcept(id) {
    const mine = ++latest.concept;
    delete $("detail").dataset.id;
    try {
      const { data } = await api("GET", conceptPath(id));
      if (mine !== latest.concept) return;
      state.selected = data.id;
      $("detail").hidden = false;
      $("detail").scrollIntoView({ block: "nearest" });
      $("detail-title").textContent = label(data);
      const tags = data.tags.length ? ` · tags ${data.tags.join(", ")}` : "";
      $("detail-meta").textContent =
        `${data.id} · ${data.type || "no type"} · ${data.status || "no status"} · version ${data.version}${tags}`;
      $("detail-text").textContent = data.text;
      fillLinks($("detail-links"), data.links);
      fillLinks($("detail-backlinks"), data.backlinks);
      for (const item of document.querySelectorAll("#answer button.item")) {
        item.classList.toggle("selected", item.parentElement.dataset.id === data.id);
      }
      if (cy) { cy.nodes().unselect(); const node = cy.getElementById(data.id); if (node.length) node.select(); }
      $("path-to").disabled = !state.pathFrom || state.pathFrom === data.id;
      const { data: suggested } = await api("POST", kbPath("/tools/link_suggest"), { id: data.id });
      if (mine !== latest.concept) return;
      const list = $("detail-suggestions");
      list.replaceChildren();
      for (const c of suggested.candidates) {
        const item = el("li");
        item.append(el("span", `${label(c)} `, "title"), el("span", `score ${c.score.toFixed(4)}`, "meta"));
        if (c.common.length) item.append(el("span", `shares neighbours: ${c.common.join(", ")}`, "evidence"));
        if (c.mention) item.append(el("span", `mentioned: “${c.mention}”`, "snippet"));
        list.append(item);
      }
      if (!suggested.candidates.length) list.append(el("li", "none", "meta"));
      $("detail").dataset.id = data.id;  // all of it shown: text, links and suggestions
      showError("");
    } catch (error) {
      if (mine === latest.concept) showError(error.message);
    }
  }

  function fillLinks(list, ids) {
    list.replaceChildren();
    for (const id of ids) {
      const item = el("li");
      const button = el("button", id, "item");
      button.type = "button";
      button.addEventListener("click", () => showConcept(id));
      item.append(button);
      list.append(item);
    }
    if (!ids.length) list.append(el("li", "none", "meta"));
  }

  async function pathTo(target) {
    const source = state.pathFrom;
    const { data } = await api("POST", kbPath("/tools/graph_path"), { source, target });
    const names = data.path.map((step) => step.title || step.id);
    $("path-result").textContent = data.path.length
      ? `${names.join(" → ")} (${data.hops} hops)`
      : data.note || "no path";
    if (!cy) return;
    cy.elements().removeClass("path");
    for (let i = 0; i < data.path.length; i += 1) {
      const step = data.path[i];
      if (!cy.getElementById(step.id).length) {
        cy.add({ data: { id: step.id, label: step.title || step.id, hops: -1, kind: "context", size: 12 },
                 classes: "context", position: { x: 0, y: 0 } });
      }
      cy.getElementById(step.id).addClass("path");
      if (i > 0) {
        const a = data.path[i - 1].id;
        const id = `path:${a}->${step.id}`;
        if (!cy.getElementById(id).length) cy.add({ data: { id, source: a, target: step.id } });
        cy.getElementById(id).addClass("path");
      }
    }
  }

  // Forget what the previous token or KB showed: nothing of it stays on the page.
  function reset() {
    latest.ask += 1;
    latest.concept += 1;
    Object.assign(state, { seq: null, answer: null, lastAsk: null, selected: null, pathFrom: null });
    if (cy) { cy.destroy(); cy = null; }
    rings = [];
    $("graph").replaceChildren();
    $("answer").replaceChildren();
    $("detail").hidden = true;
    delete $("detail").dataset.id;
    for (const id of ["detail-title", "detail-meta", "detail-text", "path-result", "status"]) $(id).textContent = "";
    for (const id of ["detail-links", "detail-backlinks", "detail-suggestions"]) $(id).replaceChildren();
    $("path-to").disabled = true;
    showError("");
  }

  async function refresh() {
    if (!state.kb || !state.lastAsk || document.hidden) return;
    try {
      const { seq } = await api("GET", kbPath("/status"));
      if (seq !== state.seq) {
        await ask(state.lastAsk);
        if (state.selected) await showConcept(state.selected);
      }
    } catch (error) {
      showError(error.message);
    }
  }

  $("connect").addEventListener("submit", async (event) => {
    event.preventDefault();
    state.token = $("token").value.trim();
    sessionStorage.setItem("kbgraph.token", state.token);
    reset();
    try { await loadKBs(); } catch (error) { showError(error.message); }
  });
  $("kb").addEventListener("change", () => { state.kb = $("kb").value; reset(); });
  $("ask").addEventListener("submit", async (event) => {
    event.preventDefault();
    try { await ask(askBody()); showError(""); } catch (error) { showError(error.message); }
  });
  $("search-button").addEventListener("click", async () => {
    try { await searchHits(); showError(""); } catch (error) { showError(error.message); }
  });
  $("path-from").addEventListener("click", () => {
    state.pathFrom = state.selected;
    $("path-result").textContent = `Path from ${state.pathFrom}: pick another concept, then "Path to here".`;
  });
  $("path-to").addEventListener("click", async () => {
    try { await pathTo(state.selected); } catch (error) { showError(error.message); }
  });
  window.addEventListener("resize", () => {
    if (!cy) return;
    cy.resize();
    cy.fit(undefined, 20);
    drawRings();
  });
  setInterval(refresh, 3000);
  window.kbgraphExplorer = {
    get cy() { return cy; }, get state() { return state; }, conceptPath,
  };

  if (state.token) {
    $("token").value = state.token;
    loadKBs().catch((error) => showError(error.message));
  }
})();
