// Offline validation of the objects `helm template` renders from helm/zenflow (tests/chart/chart-test.sh).
//
//   node validate.mjs [--deploy-dir DIR] [--rules-out DIR] LABEL FILE.yaml
//
// Every object of FILE (multi-document YAML) is validated against the Kubernetes OpenAPI schema
// of its apiVersion/kind: kubernetes-models for the built-in kinds, @kubernetes-models/
// prometheus-operator for ServiceMonitor/PodMonitor/PrometheusRule, @kubernetes-models/
// cert-manager for Certificate. On top of the schemas (which, like the API server's, allow
// unknown fields) a strict pass rejects every field the kind's type does not declare, which is
// what `kubectl apply --validate=strict` would refuse. A kind without a schema fails unless it
// is on UNVALIDATED_KINDS (printed). Also checked: the standard labels on every object, unique
// names per kind, and with --deploy-dir the dashboards and rules byte for byte against deploy/.
// --rules-out writes each PrometheusRule's spec as a rule file (for promtool check rules).
// Before any of it, a self-check proves that each check can fail. Exit 0: all passed.
import { createRequire } from "node:module";
import fs from "node:fs";
import path from "node:path";

const modulesDir = process.env.ZENFLOW_CHART_VALIDATE_DIR || "/usr/local/share/zenflow/npm/chart-validate";
const require = createRequire(path.join(modulesDir, "package.json"));
const YAML = require("yaml");

// apiVersion/kind → [module, class]. Nothing else is accepted.
const MODELS = {
  "v1/ConfigMap": ["kubernetes-models/v1", "ConfigMap"],
  "v1/PersistentVolumeClaim": ["kubernetes-models/v1", "PersistentVolumeClaim"],
  "v1/Secret": ["kubernetes-models/v1", "Secret"],
  "v1/Service": ["kubernetes-models/v1", "Service"],
  "v1/ServiceAccount": ["kubernetes-models/v1", "ServiceAccount"],
  "apps/v1/DaemonSet": ["kubernetes-models/apps/v1", "DaemonSet"],
  "apps/v1/Deployment": ["kubernetes-models/apps/v1", "Deployment"],
  "apps/v1/StatefulSet": ["kubernetes-models/apps/v1", "StatefulSet"],
  "networking.k8s.io/v1/NetworkPolicy": ["kubernetes-models/networking.k8s.io/v1", "NetworkPolicy"],
  "monitoring.coreos.com/v1/PodMonitor": ["@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1", "PodMonitor"],
  "monitoring.coreos.com/v1/PrometheusRule": ["@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1", "PrometheusRule"],
  "monitoring.coreos.com/v1/ServiceMonitor": ["@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1", "ServiceMonitor"],
  "cert-manager.io/v1/Certificate": ["@kubernetes-models/cert-manager/cert-manager.io/v1", "Certificate"],
};
// Kinds rendered without a schema to check them against. Keep it empty; a kind added here is
// printed with every run.
const UNVALIDATED_KINDS = [];
const REQUIRED_LABELS = ["app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/version",
  "app.kubernetes.io/part-of", "app.kubernetes.io/managed-by", "helm.sh/chart"];

// ---- Strict fields: the declared properties of each type, read from the packages' .d.ts ----
// The declarations are generated from the same OpenAPI/CRD schemas as the validators:
// `export interface IX { "field"?: TYPE; … }`, `export declare type IX = …;`, imports and
// `export { IX as IIoK8s… }` aliases. TYPE is a union of primitives, literals, names,
// Array<TYPE> and inline object types with `[key: string]: TYPE` index signatures.
const declFiles = new Map();
function loadDecls(file) {
  if (declFiles.has(file)) return declFiles.get(file);
  const src = fs.readFileSync(file, "utf8").replace(/\/\*\*[\s\S]*?\*\//g, "");
  const d = { file, imports: {}, locals: {}, exports: {} };
  declFiles.set(file, d);
  for (const m of src.matchAll(/import \{([^}]*)\} from "([^"]+)";/g)) {
    for (const part of m[1].split(",").map((s) => s.trim()).filter(Boolean)) {
      const [orig, as] = part.split(/\s+as\s+/);
      d.imports[(as || orig).trim()] = { from: m[2], name: orig.trim() };
    }
  }
  for (const m of src.matchAll(/export \{([^}]*)\};/g)) {
    for (const part of m[1].split(",").map((s) => s.trim()).filter(Boolean)) {
      const [orig, as] = part.split(/\s+as\s+/);
      d.exports[(as || orig).trim()] = orig.trim();
    }
  }
  const re = /export (?:declare )?(interface|type) (\w+)(?:<[^>]*>)?(?:\s+extends\s+([\w, ]+))?\s*(=)?/g;
  let m;
  while ((m = re.exec(src))) {
    const p = new TypeParser(src, re.lastIndex);
    const t = m[1] === "interface" ? p.object() : p.type();
    if (m[3]) t.bases = m[3].split(",").map((n) => ({ kind: "ref", name: n.trim() }));
    d.locals[m[2]] = t;
    re.lastIndex = p.i;
  }
  return d;
}
function resolveModule(fromFile, spec) {
  const base = spec.startsWith(".") ? path.resolve(path.dirname(fromFile), spec) : path.join(modulesDir, "node_modules", spec);
  for (const f of [base + ".d.ts", path.join(base, "index.d.ts")]) if (fs.existsSync(f)) return f;
  return null;
}
// A named type seen from `file`: its parsed type, or null (unknown: not checked further).
function lookupName(file, name) {
  const d = loadDecls(file);
  if (d.locals[name]) return { t: d.locals[name], file };
  if (d.exports[name] && d.locals[d.exports[name]]) return { t: d.locals[d.exports[name]], file };
  const imp = d.imports[name];
  if (imp) {
    const f = resolveModule(file, imp.from);
    if (f) return lookupName(f, imp.name);
  }
  return null;
}
class TypeParser {
  constructor(src, i) { this.s = src; this.i = i; }
  ws() { while (/\s/.test(this.s[this.i])) this.i++; }
  peek(str) { this.ws(); return this.s.startsWith(str, this.i); }
  eat(str) { if (!this.peek(str)) throw new Error(`d.ts parse: expected ${str} at ${this.s.slice(this.i, this.i + 40)}`); this.i += str.length; }
  type() {
    const alts = [this.postfix()];
    while (this.peek("|")) { this.eat("|"); alts.push(this.postfix()); }
    return alts.length === 1 ? alts[0] : { kind: "union", alts };
  }
  postfix() {
    let t = this.primary();
    while (this.peek("[]")) { this.eat("[]"); t = { kind: "array", of: t }; }
    return t;
  }
  primary() {
    this.ws();
    if (this.peek("{")) return this.object();
    if (this.peek("(")) { this.eat("("); const t = this.type(); this.eat(")"); return t; }
    if (this.peek('"')) { const j = this.s.indexOf('"', this.i + 1); this.i = j + 1; return { kind: "leaf" }; }
    const m = /^[\w.$-]+/.exec(this.s.slice(this.i));
    if (!m) throw new Error(`d.ts parse: unexpected ${this.s.slice(this.i, this.i + 40)}`);
    this.i += m[0].length;
    if (m[0] === "Array" && this.peek("<")) { this.eat("<"); const of = this.type(); this.eat(">"); return { kind: "array", of }; }
    if (this.peek("<")) { this.eat("<"); this.type(); while (this.peek(",")) { this.eat(","); this.type(); } this.eat(">"); }
    if (/^(string|number|boolean|any|unknown|object|null|undefined|true|false|-?\d.*)$/.test(m[0])) return { kind: "leaf" };
    return { kind: "ref", name: m[0] };
  }
  object() {
    this.eat("{");
    const props = {};
    let index = null;
    while (!this.peek("}")) {
      if (this.peek("[")) {
        this.eat("["); this.primary(); this.eat(":"); this.type(); this.eat("]"); this.eat(":");
        index = this.type();
      } else {
        this.ws();
        let key;
        if (this.peek('"')) { const j = this.s.indexOf('"', this.i + 1); key = this.s.slice(this.i + 1, j); this.i = j + 1; }
        else { key = /^\w+/.exec(this.s.slice(this.i))[0]; this.i += key.length; }
        if (this.peek("?")) this.eat("?");
        this.eat(":");
        props[key] = this.type();
      }
      if (this.peek(";")) this.eat(";");
    }
    this.eat("}");
    return { kind: "object", props, index };
  }
}
// Errors for fields of `data` the type does not declare ("path: unknown field").
function unknownFields(data, t, file, at, out) {
  if (!t || data === null || data === undefined) return;
  if (t.kind === "ref") { const r = lookupName(file, t.name); if (r) unknownFields(data, r.t, r.file, at, out); return; }
  if (t.kind === "array") { if (Array.isArray(data)) data.forEach((x, i) => unknownFields(x, t.of, file, `${at}/${i}`, out)); return; }
  if (t.kind === "union") {
    let best = null;
    for (const alt of t.alts) {
      const errs = [];
      unknownFields(data, alt, file, at, errs);
      if (errs.length === 0) return;
      if (!best || errs.length < best.length) best = errs;
    }
    out.push(...best);
    return;
  }
  if (t.kind !== "object" || typeof data !== "object" || Array.isArray(data)) return;
  for (const [k, v] of Object.entries(data)) {
    if (k in t.props) unknownFields(v, t.props[k], file, `${at}/${k}`, out);
    else if (t.index) unknownFields(v, t.index, file, `${at}/${k}`, out);
    else if (!(t.bases || []).some((b) => k in (lookupName(file, b.name)?.t.props || {}))) out.push(`${at}/${k}: unknown field`);
  }
}
function strictCheck(moduleName, className, obj) {
  const file = resolveModule(path.join(modulesDir, "x"), `${moduleName}/${className}`);
  if (!file) throw new Error(`no declarations for ${moduleName}/${className}`);
  const r = lookupName(file, `I${className}`);
  if (!r) throw new Error(`no interface I${className} in ${file}`);
  const out = [];
  unknownFields(obj, r.t, r.file, "data", out);
  return out;
}

// ---- One object ----
function validateObject(obj) {
  const errors = [];
  if (!obj || typeof obj !== "object") return ["not an object"];
  const key = `${obj.apiVersion}/${obj.kind}`;
  const model = MODELS[key];
  if (!model) {
    if (UNVALIDATED_KINDS.includes(key)) return [];
    return [`${key}: no schema for this kind (not on the allow-list)`];
  }
  const Cls = require(model[0])[model[1]];
  try {
    new Cls(obj).validate();
  } catch (e) {
    errors.push(String(e.message || e));
  }
  errors.push(...strictCheck(model[0], model[1], obj));
  const labels = obj.metadata?.labels || {};
  for (const l of REQUIRED_LABELS) if (!labels[l]) errors.push(`metadata/labels: missing ${l}`);
  return errors;
}

// ---- Self-check: each kind of failure must be detected ----
function selfCheck() {
  const labels = Object.fromEntries(REQUIRED_LABELS.map((l) => [l, "x"]));
  const deploy = (container, extra = {}) => ({
    apiVersion: "apps/v1", kind: "Deployment", metadata: { name: "d", labels },
    spec: { selector: { matchLabels: { a: "b" } }, template: { metadata: { labels: { a: "b" } }, spec: { containers: [container], ...extra } } },
  });
  const cases = [
    ["a valid Deployment", deploy({ name: "c", image: "i", ports: [{ containerPort: 80 }] }), null],
    ["containerPort as a string", deploy({ name: "c", image: "i", ports: [{ containerPort: "80" }] }), /containerPort must be integer/],
    ["a misspelt container field", deploy({ name: "c", image: "i", imagePullPolicyy: "Always" }), /containers\/0\/imagePullPolicyy: unknown field/],
    ["a misspelt pod field", deploy({ name: "c", image: "i" }, { nodeSelectr: {} }), /spec\/template\/spec\/nodeSelectr: unknown field/],
    ["a missing standard label", { ...deploy({ name: "c", image: "i" }), metadata: { name: "d" } }, /missing app.kubernetes.io\/name/],
    ["a kind without a schema", { apiVersion: "example.com/v1", kind: "Frobnicator", metadata: { name: "f", labels } }, /no schema/],
    ["a PrometheusRule with a bad for", { apiVersion: "monitoring.coreos.com/v1", kind: "PrometheusRule", metadata: { name: "r", labels },
      spec: { groups: [{ name: "g", rules: [{ alert: "A", expr: "up == 0", for: "ten minutes" }] }] } }, /rules\/0\/for must match pattern/],
    ["a PodMonitor with a misspelt endpoint field", { apiVersion: "monitoring.coreos.com/v1", kind: "PodMonitor", metadata: { name: "p", labels },
      spec: { selector: {}, podMetricsEndpoints: [{ port: "metrics", intervall: "15s" }] } }, /podMetricsEndpoints\/0\/intervall: unknown field/],
  ];
  let ok = true;
  for (const [what, obj, expect] of cases) {
    const errs = validateObject(obj);
    const good = expect === null ? errs.length === 0 : errs.some((e) => expect.test(e));
    if (!good) { ok = false; console.log(`SELF-CHECK FAILED: ${what}: got ${JSON.stringify(errs)}`); }
  }
  console.log(`self-check: ${cases.length} cases, ${ok ? "each detected as expected" : "FAILED"}`);
  return ok;
}

// ---- deploy/ identity ----
function checkDeployIdentity(docs, texts, deployDir) {
  const errors = [];
  let dashboards = 0, rules = 0;
  docs.forEach((obj, i) => {
    const src = obj.metadata?.annotations?.["zenflow.io/source"];
    if (!src) return;
    const file = path.join(deployDir, src.replace(/^deploy\//, ""));
    if (!fs.existsSync(file)) { errors.push(`${obj.kind}/${obj.metadata.name}: source ${src} does not exist`); return; }
    const want = fs.readFileSync(file);
    if (obj.kind === "ConfigMap") {
      for (const [k, v] of Object.entries(obj.data || {})) {
        dashboards++;
        if (k !== path.basename(file)) errors.push(`ConfigMap/${obj.metadata.name}: key ${k} is not ${path.basename(file)}`);
        if (!Buffer.from(v, "utf8").equals(want)) errors.push(`ConfigMap/${obj.metadata.name}: data[${k}] differs from ${src}`);
      }
    } else if (obj.kind === "PrometheusRule") {
      rules++;
      // The text under `spec:` in the rendered document, less the 2-space indent, is the file.
      const text = texts[i];
      const at = text.indexOf("\nspec:\n");
      const body = at < 0 ? "" : text.slice(at + "\nspec:\n".length).split("\n")
        .map((l) => (l.startsWith("  ") ? l.slice(2) : l.trim() === "" ? "" : `\0${l}`)).join("\n");
      if (body.replace(/\n+$/, "\n") !== want.toString("utf8").replace(/\n+$/, "\n"))
        errors.push(`PrometheusRule/${obj.metadata.name}: spec text differs from ${src}`);
      if (JSON.stringify(obj.spec) !== JSON.stringify(YAML.parse(want.toString("utf8"))))
        errors.push(`PrometheusRule/${obj.metadata.name}: spec differs from ${src} once parsed`);
    }
  });
  return { errors, dashboards, rules };
}

// ---- main ----
const args = process.argv.slice(2);
let deployDir = null, rulesOut = null;
while (args[0]?.startsWith("--")) {
  const flag = args.shift();
  if (flag === "--deploy-dir") deployDir = args.shift();
  else if (flag === "--rules-out") rulesOut = args.shift();
  else { console.error(`validate.mjs: unknown flag ${flag}`); process.exit(2); }
}
if (args.length !== 2) { console.error("usage: node validate.mjs [--deploy-dir DIR] [--rules-out DIR] LABEL FILE.yaml"); process.exit(2); }
const [label, input] = args;
if (!selfCheck()) process.exit(1);

const stream = fs.readFileSync(input, "utf8");
const parsed = YAML.parseAllDocuments(stream);
const docs = [], texts = [];
let failures = 0;
for (const d of parsed) {
  if (d.errors.length) { console.log(`FAIL ${label}: YAML: ${d.errors[0].message}`); failures++; continue; }
  const obj = d.toJS();
  if (obj === null || obj === undefined) continue;
  docs.push(obj);
  texts.push(stream.slice(d.range[0], d.range[2]));
}
const counts = {}, seen = new Set();
for (const obj of docs) {
  const id = `${obj.kind}/${obj.metadata?.namespace ?? ""}/${obj.metadata?.name}`;
  counts[obj.kind] = (counts[obj.kind] || 0) + 1;
  const errs = validateObject(obj);
  if (seen.has(id)) errs.push("rendered twice");
  seen.add(id);
  for (const e of errs) { console.log(`FAIL ${label}: ${obj.kind}/${obj.metadata?.name}: ${e}`); failures++; }
}
if (deployDir) {
  const r = checkDeployIdentity(docs, texts, deployDir);
  for (const e of r.errors) { console.log(`FAIL ${label}: ${e}`); failures++; }
  console.log(`${label}: deploy/ identity: ${r.dashboards} dashboard(s), ${r.rules} rule file(s) compared`);
}
if (rulesOut) {
  fs.mkdirSync(rulesOut, { recursive: true });
  for (const obj of docs.filter((o) => o.kind === "PrometheusRule"))
    fs.writeFileSync(path.join(rulesOut, `${obj.metadata.name}.yml`), YAML.stringify(obj.spec));
}
const summary = Object.keys(counts).sort().map((k) => `${k} ${counts[k]}`).join(", ");
console.log(`${label}: ${docs.length} objects (${summary || "none"}); schemas: ${Object.keys(MODELS).length} kinds; ` +
  `allow-list without schema: ${UNVALIDATED_KINDS.length ? UNVALIDATED_KINDS.join(", ") : "none"}`);
if (failures) { console.log(`${label}: ${failures} failure(s)`); process.exit(1); }
console.log(`${label}: every object valid`);
