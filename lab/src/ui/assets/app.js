// podpath ui: the page. It draws the lab from the server's `picture` events (the whole picture
// each time), appends `timeline` events, and asks the server for traces, rules, the policy
// matrix and actions. No framework: DOM and SVG built here.
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const $ = (id) => document.getElementById(id);
let picture = null;
// When each Service was first on screen (ms since the epoch, sub-ms): what the benchmark reads
// to time a change in the API to the page.
window.podpathSeen = {};
let selected = null; // {kind: "host"|"pod", id}
const traces = []; // past traces: {n, ask, result, at}
const rulesSeen = new Map(); // service → Set of rule texts seen last time

function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") e.className = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (v !== undefined && v !== null && v !== false) e.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) if (c !== null && c !== undefined) e.append(c);
  return e;
}

function svg(tag, attrs = {}, ...children) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (v !== undefined && v !== null) e.setAttribute(k, v);
  }
  for (const c of children.flat()) if (c !== null && c !== undefined) e.append(c);
  return e;
}

function text(x, y, s, cls) {
  return svg("text", { x, y, class: cls }, String(s));
}

async function api(method, path, body) {
  const opts = { method, headers: {} };
  if (body !== undefined) {
    opts.headers["Content-Type"] = "application/json";
    opts.body = JSON.stringify(body);
  }
  let r;
  try {
    r = await fetch(path, opts);
  } catch (e) {
    throw new Error("podpath ui does not answer (" + e.message + "): is it still running?");
  }
  let doc = null;
  try {
    doc = await r.json();
  } catch (_) {
    /* not JSON */
  }
  if (!r.ok) throw new Error((doc && doc.error) || ("HTTP " + r.status));
  return doc;
}

// ---- connection ---------------------------------------------------------------------------

function connect() {
  const conn = $("conn");
  const es = new EventSource("/api/events");
  es.addEventListener("open", () => {
    conn.dataset.state = "live";
    conn.textContent = "live";
  });
  es.addEventListener("error", () => {
    // EventSource reconnects by itself; say so meanwhile.
    conn.dataset.state = "lost";
    conn.textContent = "connection to podpath ui lost — reconnecting…";
    if (es.readyState === EventSource.CLOSED) {
      // Refused rather than dropped: a server started again has forgotten this page's session.
      fetch("/api/picture").then((r) => {
        if (r.status === 401) {
          conn.textContent = "signed out (was podpath ui started again?): open the link it printed, or reload to give the lab's token";
        } else {
          setTimeout(connect, 2000);
        }
      }, () => setTimeout(connect, 2000));
    }
  });
  es.addEventListener("picture", (ev) => {
    const p = JSON.parse(ev.data);
    if (!p) return;
    picture = p;
    draw();
  });
  es.addEventListener("timeline", (ev) => addTimeline(JSON.parse(ev.data)));
}

function addTimeline(entry) {
  const list = $("timeline");
  const li = el("li", {}, el("span", { class: "at" }, entry.at.toFixed(1) + " s"), entry.line);
  list.prepend(li);
  while (list.children.length > 500) list.lastChild.remove();
}

// ---- the picture -----------------------------------------------------------------------------

function draw() {
  const p = picture;
  $("lab-name").textContent = p.lab.name;
  $("lab-summary").textContent =
    `${p.lab.proxy_mode} proxy · ${p.lab.lb_mode} load balancer · ${p.lab.ip_family} · API ${p.lab.api}`;
  const conn = $("conn");
  if (p.lab_down) {
    conn.dataset.state = "down";
    conn.textContent = "the lab is down (taken down while the UI runs); start it with `podpath up`";
  } else if (p.api_error) {
    conn.dataset.state = "lost";
    conn.textContent = "API unreachable, retrying: " + p.api_error;
  } else if (conn.dataset.state !== "lost") {
    conn.dataset.state = "live";
    conn.textContent = "live";
  }
  // What the page shows of a lab whose API or state is gone is its last known picture.
  $("map").classList.toggle("stale", Boolean(p.lab_down || p.api_error));
  drawMap(p);
  drawServices(p);
  drawOthers(p);
  fillSelects(p);
  drawDetails();
  refreshRulesIfShown();
  // The first whole picture on screen, for the page-load benchmark.
  if (!performance.getEntriesByName("first-picture").length) {
    performance.mark("first-picture");
    window.podpathFirstPicture = { pods: p.pods.length, nodes: p.hosts.filter((h) => h.role === "node").length };
  }
}

const NODE_W = 250, POD_H = 22, GAP = 20, SVC_W = 230;

function layout(p) {
  const nodes = p.hosts.filter((h) => h.role === "node");
  const podsOf = (n) => p.pods.filter((x) => x.node === n).sort((a, b) => a.id.localeCompare(b.id));
  const pos = {};
  pos.client = { x: 20, y: 20, w: 150, h: 64 };
  pos.gateway = { x: 220, y: 20, w: 190, h: 64 };
  pos["control-plane"] = { x: 460, y: 20, w: 190, h: 64 };
  const busY = 120;
  let maxH = 0;
  nodes.forEach((n, i) => {
    const h = 78 + podsOf(n.name).length * (POD_H + 4) + (n.faults.length ? 16 * n.faults.length : 0);
    pos[n.name] = { x: 20 + i * (NODE_W + GAP), y: busY + 30, w: NODE_W, h };
    maxH = Math.max(maxH, h);
  });
  const svcY = busY + 30 + maxH + 60;
  const width = Math.max(680, 20 + nodes.length * (NODE_W + GAP), 20 + p.services.length * (SVC_W + GAP));
  return { nodes, podsOf, pos, busY, svcY, width, height: svcY + (p.services.length ? 70 : 10) };
}

function drawMap(p) {
  const map = $("map");
  const L = layout(p);
  const keepTitle = [$("map-title"), $("map-desc")];
  map.replaceChildren(...keepTitle);
  map.setAttribute("viewBox", `0 0 ${L.width} ${L.height}`);
  // Drawn at its own size (a small lab is not blown up), shrunk to fit a narrow window.
  map.setAttribute("width", Math.round(L.width * 1.2));
  map.setAttribute("height", Math.round(L.height * 1.2));
  map.append(
    svg("defs", {},
      svg("marker", { id: "arrow", viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 6, markerHeight: 6, orient: "auto-start-reverse" },
        svg("path", { d: "M 0 0 L 10 5 L 0 10 z", class: "dot" }))));
  const wires = svg("g", { class: "wires" });
  const c = (n) => ({ x: L.pos[n].x + L.pos[n].w / 2, y: L.pos[n].y + L.pos[n].h / 2 });
  // The external network: client — gateway.
  wires.append(svg("line", { x1: L.pos.client.x + L.pos.client.w, y1: c("client").y, x2: L.pos.gateway.x, y2: c("gateway").y, class: "wire" }));
  wires.append(text(L.pos.client.x + L.pos.client.w + 4, c("client").y - 6, "external", "mono"));
  // The underlay: a bus everyone but the client hangs on.
  wires.append(svg("line", { x1: 20, y1: L.busY, x2: L.width - 20, y2: L.busY, class: "wire" }));
  const underlay = p.networks.find((n) => n.name === "underlay");
  wires.append(text(L.width - 220, L.busY - 6, "underlay " + (underlay ? underlay.cidr : ""), "mono"));
  for (const h of p.hosts) {
    if (h.name === "client" || !L.pos[h.name]) continue;
    const b = L.pos[h.name];
    const top = b.y > L.busY ? b.y : b.y + b.h;
    wires.append(svg("line", { x1: b.x + 30, y1: top, x2: b.x + 30, y2: L.busY, class: "wire" }));
  }
  map.append(wires);
  const podBox = {};
  for (const h of p.hosts) {
    const b = L.pos[h.name];
    if (!b) continue;
    const g = svg("g", {
      class: `host ${h.role}` + (selected && selected.kind === "host" && selected.id === h.name ? " selected" : ""),
      "data-node": h.role === "node" ? h.name : null,
      "data-host": h.name,
      "data-ready": h.ready,
      tabindex: 0,
      role: "button",
      "aria-label": hostLabel(h),
      onclick: () => select("host", h.name),
      onkeydown: (e) => { if (e.key === "Enter" || e.key === " ") { e.preventDefault(); select("host", h.name); } },
    });
    g.append(svg("title", {}, hostLabel(h)));
    g.append(svg("rect", { x: b.x, y: b.y, width: b.w, height: b.h, rx: 8, class: "box" }));
    g.append(text(b.x + 10, b.y + 18, h.name, "title"));
    g.append(text(b.x + 10, b.y + 34, h.addresses.join(", "), "mono"));
    let line = b.y + 50;
    if (h.role === "node") {
      const state = h.ready === "True" ? "Ready" : "NotReady" + (h.reason ? ` (${h.reason})` : "");
      g.append(text(b.x + 10, line, `${state} · pods ${h.pod_cidr || "?"}`, h.ready === "True" ? "ok" : "bad"));
      line += 16;
      g.append(text(b.x + 10, line, `agent ${h.running ? "running" : "stopped"} · proxy /healthz ${h.healthz || "?"}`, h.running ? "" : "bad"));
      line += 8;
    } else if (h.role !== "client") {
      g.append(text(b.x + 10, line, h.role === "gateway" ? `lb-sim ${h.running ? "running" : "stopped"}` : `apiserver-lite ${h.running ? "running" : "stopped"}`, h.running ? "" : "bad"));
    }
    for (const f of h.faults) {
      line += 16;
      const ft = f.slice(h.name.length + 1);
      g.append(text(b.x + 10, line, "⚠ " + (ft.length > 36 ? ft.slice(0, 35) + "…" : ft), "fault"));
    }
    map.append(g);
    if (h.role === "node") {
      L.podsOf(h.name).forEach((pod, i) => {
        const y = line + 8 + i * (POD_H + 4);
        const pg = svg("g", {
          class: "pod" + (selected && selected.kind === "pod" && selected.id === pod.id ? " selected" : ""),
          "data-pod": pod.id,
          "data-ready": String(pod.ready),
          tabindex: 0,
          role: "button",
          "aria-label": podLabel(pod),
          onclick: (e) => { e.stopPropagation(); select("pod", pod.id); },
          onkeydown: (e) => { if (e.key === "Enter" || e.key === " ") { e.preventDefault(); e.stopPropagation(); select("pod", pod.id); } },
        });
        pg.append(svg("title", {}, podLabel(pod)));
        pg.append(svg("rect", { x: b.x + 8, y, width: b.w - 16, height: POD_H, rx: 4 }));
        const name = pod.id.length > 22 ? pod.id.slice(0, 21) + "…" : pod.id;
        pg.append(text(b.x + 14, y + 15, `${name} ${pod.ip || ""}`, "mono"));
        podBox[pod.id] = { x: b.x + b.w / 2, y: y + POD_H };
        map.append(pg);
      });
    }
  }
  // Services: a row under the nodes, a line to each endpoint's pod.
  p.services.forEach((s, i) => {
    const x = 20 + i * (SVC_W + GAP), y = L.svcY;
    const g = svg("g", { class: "svc", "data-service": s.id });
    g.append(svg("title", {}, serviceLabel(s)));
    for (const e of s.endpoints) {
      const to = e.pod && podBox[e.pod];
      if (to) g.append(svg("path", { d: `M ${x + SVC_W / 2} ${y} C ${x + SVC_W / 2} ${y - 30}, ${to.x} ${to.y + 30}, ${to.x} ${to.y}`, class: "ep" + (e.ready ? "" : " notready") }));
    }
    g.append(svg("rect", { x, y, width: SVC_W, height: 52, rx: 6 }));
    g.append(text(x + 8, y + 16, s.id.length > 30 ? s.id.slice(0, 29) + "…" : s.id, "title"));
    g.append(text(x + 8, y + 31, `${s.type} ${s.cluster_ips.join(",")}`, "mono"));
    g.append(text(x + 8, y + 45, s.lb_ips.length ? "LB " + s.lb_ips.join(",") : (s.node_ports.length ? "nodePort " + s.node_ports.join(",") : ""), "mono"));
    map.append(g);
  });
  $("map-desc").textContent = describe(p);
  if (activeTrace) replayTracePath();
}

function hostLabel(h) {
  let s = `${h.name} (${h.role}) ${h.addresses.join(", ")}`;
  if (h.role === "node") s += `: ${h.ready === "True" ? "Ready" : "NotReady"}, agent ${h.running ? "running" : "stopped"}`;
  if (h.faults.length) s += ". Faults: " + h.faults.join("; ");
  return s;
}

function podLabel(p) {
  return `pod ${p.id} on ${p.node || "no node"}: ${p.phase}, ${p.ready ? "ready" : "not ready"}${p.ip ? ", " + p.ip : ""}${p.restarts ? `, ${p.restarts} restarts` : ""}${p.terminating ? ", terminating" : ""}`;
}

function serviceLabel(s) {
  const ready = s.endpoints.filter((e) => e.ready).length;
  return `Service ${s.id} (${s.type}) ClusterIP ${s.cluster_ips.join(", ") || "none"}, ports ${s.ports.join("; ")}${s.lb_ips.length ? ", LB " + s.lb_ips.join(", ") : ""}, ${ready} of ${s.endpoints.length} endpoints ready`;
}

/// The picture in words, for screen readers and as the SVG's description.
function describe(p) {
  const nodes = p.hosts.filter((h) => h.role === "node");
  return [
    `Lab ${p.lab.name}: a client on the external network, the gateway, the control plane and ${nodes.length} nodes on the underlay.`,
    ...nodes.map((n) => `${n.name} is ${n.ready === "True" ? "Ready" : "NotReady"} with pods ${p.pods.filter((x) => x.node === n.name).map((x) => x.id).join(", ") || "none"}.`),
    ...p.services.map(serviceLabel),
  ].join(" ");
}

function drawServices(p) {
  const body = $("services").tBodies[0];
  const now = performance.timeOrigin + performance.now();
  for (const s of p.services) if (!(s.id in window.podpathSeen)) window.podpathSeen[s.id] = now;
  body.replaceChildren(...p.services.map((s) => {
    const ready = s.endpoints.filter((e) => e.ready);
    const target = curlTarget(s);
    return el("tr", { "data-service": s.id },
      el("th", { scope: "row" }, s.id),
      el("td", {}, s.type),
      el("td", { class: "mono" }, s.cluster_ips.join(", ")),
      el("td", { class: "mono" }, s.ports.join("; ")),
      el("td", { class: "mono" }, s.lb_ips.join(", ")),
      el("td", { class: "mono endpoints" }, s.endpoints.map((e) => el("div", { class: e.ready ? "ok" : "bad" }, `${e.ip}${e.node ? " (" + e.node + ")" : ""}${e.ready ? "" : " not ready"}`)), ready.length ? null : el("span", { class: "bad" }, "none ready")),
      el("td", {}, s.rotation.join(", ")),
      el("td", {},
        target ? el("button", { type: "button", class: "curl", "aria-label": `curl ${s.id} from the client (trace)`, onclick: () => runTrace({ from: "client", target }) }, "curl") : null,
        el("button", { type: "button", class: "rules", "aria-label": `rules of ${s.id}`, onclick: () => { showTab("rules"); $("rules-service").value = s.id; loadRules(s.id); } }, "rules")));
  }));
}

/// What "curl" on a Service reaches from the client: its LB IP, else a node's NodePort.
function curlTarget(s) {
  const port = s.port || 80;
  if (s.lb_ips.length) return `http://${s.lb_ips[0]}${port === 80 ? "" : ":" + port}/`;
  if (s.node_ports.length) {
    const node = picture.hosts.find((h) => h.role === "node" && h.ready === "True");
    if (node) return `http://${node.addresses[0]}:${s.node_ports[0]}/`;
  }
  return null;
}

function drawOthers(p) {
  const box = $("others");
  const section = (title, items) => items.length ? [el("h2", {}, title), el("ul", {}, items.map((i) => el("li", {}, el("strong", {}, i.id), " — " + i.detail)))] : [];
  box.replaceChildren(...section("Ingresses", p.ingresses), ...section("Gateways", p.gateways), ...section("HTTPRoutes", p.routes));
  $("policies").replaceChildren(...section("NetworkPolicies", p.policies));
}

function fillSelects(p) {
  const from = $("trace-from");
  const choices = ["client", "gateway", ...p.hosts.filter((h) => h.role === "node").map((h) => h.name),
    ...p.pods.filter((x) => x.phase === "Running" && x.ip).map((x) => "pod/" + x.id)];
  syncOptions(from, choices);
  syncOptions($("rules-service"), p.services.map((s) => s.id));
}

function syncOptions(select, values) {
  const now = [...select.options].map((o) => o.value);
  if (now.join("\n") === values.join("\n")) return;
  const keep = select.value;
  select.replaceChildren(...values.map((v) => el("option", { value: v }, v)));
  if (values.includes(keep)) select.value = keep;
}

// ---- selection and actions -------------------------------------------------------------------

function select(kind, id) {
  selected = { kind, id };
  drawMap(picture);
  drawDetails();
  const focus = document.querySelector(kind === "host" ? `[data-host="${id}"]` : `[data-pod="${id}"]`);
  if (focus) focus.focus();
}

function drawDetails() {
  const box = $("details");
  if (!selected || !picture) {
    box.replaceChildren("Nothing selected.");
    return;
  }
  const act = (label, body) => el("button", { type: "button", "data-action": body.action, onclick: () => doAction(body) }, label);
  if (selected.kind === "host") {
    const h = picture.hosts.find((x) => x.name === selected.id);
    if (!h) return box.replaceChildren("Gone.");
    const parts = [el("strong", {}, hostLabel(h)), el("br")];
    if (h.role === "node") {
      const n = h.name;
      parts.push(
        h.running ? act("Stop node", { action: "node-stop", node: n }) : act("Start node", { action: "node-start", node: n }),
        h.faults.some((f) => f.startsWith(n + " link-down:")) ? act("Link up", { action: "link-up", node: n }) : act("Link down", { action: "link-down", node: n }),
        act("Loss 30 %", { action: "loss", node: n, percent: 30 }),
        act("Stall proxy 30 s", { action: "stall-proxy", node: n, seconds: 30 }),
        act("Flush rules", { action: "flush-rules", node: n }),
        act("Clear faults", { action: "clear", node: n }),
        el("button", { type: "button", onclick: () => { $("trace-from").value = n; $("trace-target").focus(); } }, "Trace from here"));
    } else if (h.name !== "control-plane") {
      parts.push(el("button", { type: "button", onclick: () => { $("trace-from").value = h.name; $("trace-target").focus(); } }, "Trace from here"));
    }
    box.replaceChildren(...parts);
  } else {
    const pod = picture.pods.find((x) => x.id === selected.id);
    if (!pod) return box.replaceChildren(`pod ${selected.id}: deleted.`);
    box.replaceChildren(el("strong", {}, podLabel(pod)), el("br"),
      act("Kill pod", { action: "kill-pod", pod: pod.id }),
      el("button", { type: "button", onclick: () => { $("trace-from").value = "pod/" + pod.id; $("trace-target").focus(); } }, "Trace from here"),
      pod.ip ? el("button", { type: "button", onclick: () => runTrace({ from: "client", target: `http://${pod.ip}/` }) }, "Trace to it from the client") : null);
  }
}

async function doAction(body) {
  const out = $("action-result");
  out.className = "";
  out.textContent = `${body.action} ${body.node || body.pod || ""}…`;
  for (const b of $("details").querySelectorAll("button")) b.disabled = true;
  try {
    const r = await api("POST", "/api/action", body);
    out.className = "ok";
    out.textContent = r.message;
  } catch (e) {
    out.className = "bad";
    out.textContent = e.message;
  } finally {
    drawDetails();
  }
}

// ---- traces ----------------------------------------------------------------------------------

let activeTrace = null; // {result, shown}: the trace drawn on the map

async function runTrace(ask) {
  showTab("map");
  $("trace-from").value = ask.from;
  $("trace-target").value = ask.target;
  const box = $("trace-result");
  box.dataset.state = "running";
  box.replaceChildren();
  $("trace-run").disabled = true;
  const n = traces.length + 1;
  try {
    const result = await api("POST", "/api/trace", ask);
    const entry = { n, ask, result, at: new Date().toLocaleTimeString() };
    traces.push(entry);
    drawTraceList();
    await animate(entry);
  } catch (e) {
    box.dataset.state = "failed";
    box.replaceChildren(el("p", { class: "bad", role: "alert" }, "The trace did not run: " + e.message));
  } finally {
    $("trace-run").disabled = false;
  }
}

function hopList(result, pending) {
  const items = [];
  if (result.lookup) {
    const l = result.lookup;
    items.push(el("li", { class: "hop lookup", "data-host": "dns" },
      el("h3", {}, `DNS lookup of ${l.name}`),
      el("ul", {}, l.queries.map((q) => el("li", { class: "step", "data-kind": "dns" }, `${q.name} ${q.type}: ${q.rcode}${q.answers.length ? " → " + q.answers.join("; ") : ""}${q.answered_by ? " (answered by " + q.answered_by + ")" : ""}`)),
        l.address ? el("li", { class: "step" }, `then to ${l.address}${l.owner ? " (" + l.owner + ")" : ""}`) : null)));
  }
  result.hops.forEach((h, i) => {
    items.push(el("li", { class: "hop" + (pending ? " pending" : ""), "data-host": h.host, "data-index": i },
      el("h3", {}, h.host),
      el("ul", {}, h.steps.map((s) => el("li", { class: "step", "data-kind": s.kind },
        el("span", { class: "step-text" }, s.text),
        s.object ? el("span", { class: "hint" }, ` (${s.object})`) : null,
        s.rule ? el("code", {}, s.rule) : null)))));
  });
  return el("ol", { class: "hops" }, items);
}

function outcomeOf(r) {
  const o = r.outcome;
  const parts = [o.answered ? `answered HTTP ${o.status} in ${o.millis.toFixed(1)} ms` : `no answer: ${o.error || "timed out"}`];
  if (r.pod) parts.push(`served by pod ${r.pod}${r.pod_saw ? ", which saw the client as " + r.pod_saw : ""}`);
  if (r.stopped) parts.push(`stopped: ${r.stopped}`);
  return el("p", { class: "outcome " + (o.answered ? "ok" : "bad") }, parts.join(" · "));
}

async function animate(entry) {
  const box = $("trace-result");
  const r = entry.result;
  box.dataset.state = "animating";
  const list = hopList(r, true);
  box.replaceChildren(el("p", {}, `Trace #${entry.n}: ${r.from} → ${entry.ask.target} (${r.src} → ${r.dst})`), list);
  activeTrace = { result: r, shown: 0 };
  const hops = [...list.querySelectorAll(".hop:not(.lookup)")];
  const delay = matchMedia("(prefers-reduced-motion: reduce)").matches ? 0 : 450;
  for (let i = 0; i < hops.length; i++) {
    hops.forEach((h) => h.classList.remove("current"));
    hops[i].classList.remove("pending");
    hops[i].classList.add("current");
    activeTrace.shown = i + 1;
    replayTracePath();
    if (delay) await new Promise((ok) => setTimeout(ok, delay));
  }
  box.append(outcomeOf(r), el("details", {}, el("summary", {}, "conntrack and the reply's path"),
    el("ul", {}, [...r.conntrack, ...r.reply_path].map((l) => el("li", { class: "mono" }, l)))),
    el("button", { type: "button", onclick: () => exportTrace(entry) }, "Export trace as SVG"));
  box.dataset.state = "done";
}

/// Draws the active trace's hops shown so far on the map: the hosts lit, an arrow between each.
function replayTracePath() {
  const map = $("map");
  map.querySelectorAll(".trace-path, .trace-dot").forEach((e) => e.remove());
  map.querySelectorAll(".hop-active").forEach((e) => e.classList.remove("hop-active"));
  if (!activeTrace) return;
  const r = activeTrace.result;
  const centre = (name) => {
    const g = map.querySelector(`[data-host="${name}"] rect.box`) || map.querySelector(`[data-pod="${name}"] rect`);
    if (!g) return null;
    const b = g.getBBox();
    return { x: b.x + b.width / 2, y: b.y + b.height / 2 };
  };
  const path = r.hops.slice(0, activeTrace.shown).map((h) => h.host);
  // A request from a pod starts in it.
  if (r.from.startsWith("pod/")) path.unshift(r.from.slice(4));
  if (activeTrace.shown >= r.hops.length && r.pod) path.push(r.pod);
  let prev = null;
  for (const name of path) {
    const g = map.querySelector(`[data-host="${name}"]`) || map.querySelector(`[data-pod="${name}"]`);
    if (g) g.classList.add("hop-active");
    const c = centre(name);
    if (prev && c && (prev.x !== c.x || prev.y !== c.y)) {
      map.append(svg("line", { x1: prev.x, y1: prev.y, x2: c.x, y2: c.y, class: "trace-path" }));
    }
    if (c) prev = c;
  }
  if (prev) map.append(svg("circle", { cx: prev.x, cy: prev.y, r: 7, class: "dot trace-dot" }));
}

function drawTraceList() {
  const list = $("trace-list");
  list.replaceChildren(...traces.map((t) => el("li", {},
    el("label", {}, el("input", { type: "checkbox", value: t.n, onchange: drawCompare }),
      ` #${t.n} ${t.at}: ${t.ask.from} → ${t.ask.target} — ${t.result.outcome.answered ? "HTTP " + t.result.outcome.status : "no answer"} via ${t.result.hops.map((h) => h.host).join(" → ")}`),
    " ", el("button", { type: "button", onclick: () => { showTab("map"); animate(t); } }, "Replay"))));
}

function drawCompare() {
  const ticked = [...$("trace-list").querySelectorAll("input:checked")].map((i) => traces[Number(i.value) - 1]).slice(-2);
  $("compare").replaceChildren(el("div", { class: "compare" }, ticked.map((t) =>
    el("div", {}, el("h3", {}, `#${t.n} ${t.ask.from} → ${t.ask.target}`), outcomeOf(t.result), hopList(t.result, false)))));
}

// ---- rules -----------------------------------------------------------------------------------

async function loadRules(service) {
  const box = $("rules");
  box.dataset.state = "loading";
  try {
    const e = await api("GET", "/api/rules?service=" + encodeURIComponent(service));
    const before = rulesSeen.get(service);
    const now = new Set();
    const parts = [el("h3", {}, `Service ${e.service}`), el("ul", {}, e.summary.map((s) => el("li", {}, s))),
      el("ul", {}, e.endpoints.map((p) => el("li", {}, `${p.port}: ${p.endpoints.join(", ") || "no ready endpoints"}`)))];
    for (const g of e.groups) {
      const chains = g.chains.map((c) => el("div", { class: "chain" },
        el("h4", {}, `${c.table} ${c.chain}`, el("span", { class: "hint" }, " — " + c.purpose)),
        c.rules.map((r) => {
          now.add(r.rule);
          const changed = before && !before.has(r.rule);
          return el("div", { class: "rule" + (changed ? " changed" : ""), "data-changed": changed ? "true" : null }, r.words, el("br"), el("code", {}, r.rule));
        }),
        (c.shares || []).length ? el("p", { class: "hint" }, "new connections: " + c.shares.map((s) => `${s.endpoint} ${(s.share * 100).toFixed(0)} %`).join(", ")) : null));
      parts.push(el("div", { class: "group" }, el("strong", {}, g.nodes.join(", ")),
        g.endpointPickedByUserspaceProxy ? el("p", { class: "hint" }, "the userspace proxy picks the endpoint") : null, chains));
    }
    rulesSeen.set(service, now);
    box.replaceChildren(...parts);
    box.dataset.service = service;
    box.dataset.state = "done";
  } catch (err) {
    box.dataset.state = "failed";
    box.replaceChildren(el("p", { class: "bad", role: "alert" }, err.message));
  }
}

/// The rules view follows the Service: a change of its endpoints or addresses reloads it (with
/// the changed rules marked), as `podpath rules --watch` prints changes.
let rulesKey = "";
function refreshRulesIfShown() {
  const box = $("rules");
  if ($("view-rules").hidden || !box.dataset.service) return;
  const s = picture.services.find((x) => x.id === box.dataset.service);
  const key = JSON.stringify(s || null);
  if (key !== rulesKey) {
    rulesKey = key;
    if (box.dataset.state !== "loading") setTimeout(() => loadRules(box.dataset.service), 300);
  }
}

// ---- policy matrix ---------------------------------------------------------------------------

async function loadMatrix() {
  const box = $("matrix");
  box.dataset.state = "running";
  box.replaceChildren(el("p", {}, "probing every pair…"));
  const q = new URLSearchParams({ namespaces: $("matrix-namespaces").value, ports: $("matrix-ports").value });
  try {
    const doc = await api("GET", "/api/matrix?" + q);
    const m = doc.matrix;
    const tables = Object.entries(m.results).map(([proto, rows]) => {
      const [protocol, port] = proto.split("/");
      const head = el("tr", {}, el("th", { scope: "col" }, "from \\ to"), m.pods.map((p) => el("th", { scope: "col", class: "mono" }, p)));
      const body = m.pods.map((from) => el("tr", {}, el("th", { scope: "row", class: "mono" }, from),
        m.pods.map((to) => {
          const ok = rows[from] && rows[from][to];
          const label = `${from} to ${to} on ${proto}: ${ok ? "connected" : "not connected"}; open its trace`;
          return el("td", {}, el("button", {
            type: "button", class: ok ? "dot" : "x", "data-from": from, "data-to": to, "aria-label": label, title: label,
            onclick: () => runTrace({ from: "pod/" + from, target: protocol === "tcp" ? `http://${doc.ips[to]}:${port}/` : `${doc.ips[to]}:${port}` }),
          }, ok ? "." : "X"));
        })));
      return [el("h3", {}, proto), el("table", {}, el("thead", {}, head), el("tbody", {}, body))];
    });
    box.replaceChildren(el("p", { class: "hint" }, "Rows from, columns to: . connected, X not. A cell opens the trace of that pair."), ...tables.flat());
    box.dataset.state = "done";
  } catch (e) {
    box.dataset.state = "failed";
    box.replaceChildren(el("p", { class: "bad", role: "alert" }, e.message));
  }
}

// ---- export ----------------------------------------------------------------------------------

/// A standalone SVG of an element of the page: its drawing with the page's styles inlined.
function download(name, svgText) {
  const a = el("a", { href: URL.createObjectURL(new Blob([svgText], { type: "image/svg+xml" })), download: name });
  document.body.append(a);
  a.click();
  a.remove();
}

function exportMap() {
  const copy = $("map").cloneNode(true);
  copy.setAttribute("xmlns", SVG);
  const css = [...document.styleSheets].flatMap((s) => [...s.cssRules]).map((r) => r.cssText).filter((t) => t.startsWith("svg") || t.startsWith(":root")).join("\n");
  copy.prepend(svg("style", {}, css));
  download(`podpath-${picture ? picture.lab.name : "lab"}-map.svg`, new XMLSerializer().serializeToString(copy));
}

function exportTrace(entry) {
  // The server's picture of it, as `podpath trace --output svg` draws it.
  download(`podpath-trace-${entry.n}.svg`, entry.result.svg);
}

// ---- tabs and wiring -------------------------------------------------------------------------

function showTab(name) {
  for (const t of document.querySelectorAll('[role="tab"]')) {
    const on = t.id === "tab-" + name;
    t.setAttribute("aria-selected", String(on));
    t.tabIndex = on ? 0 : -1;
    $(t.getAttribute("aria-controls")).hidden = !on;
  }
  if (name === "rules") refreshRulesIfShown();
}

document.querySelector('[role="tablist"]').addEventListener("keydown", (e) => {
  const tabs = [...document.querySelectorAll('[role="tab"]')];
  const i = tabs.indexOf(document.activeElement);
  if (i < 0 || (e.key !== "ArrowRight" && e.key !== "ArrowLeft")) return;
  const next = tabs[(i + (e.key === "ArrowRight" ? 1 : tabs.length - 1)) % tabs.length];
  next.focus();
  showTab(next.id.slice(4));
});
for (const t of document.querySelectorAll('[role="tab"]')) t.addEventListener("click", () => showTab(t.id.slice(4)));
$("trace-form").addEventListener("submit", (e) => {
  e.preventDefault();
  runTrace({ from: $("trace-from").value, target: $("trace-target").value.trim(), host: $("trace-host").value.trim() || undefined });
});
$("rules-form").addEventListener("submit", (e) => { e.preventDefault(); loadRules($("rules-service").value); });
$("matrix-form").addEventListener("submit", (e) => { e.preventDefault(); loadMatrix(); });
$("export-map").addEventListener("click", exportMap);
$("projector").addEventListener("click", (e) => {
  const on = document.body.classList.toggle("projector");
  e.target.setAttribute("aria-pressed", String(on));
});
connect();
