#!/usr/bin/python3
"""deploy/k8s/ parses, and what it runs exists.

Every manifest is loaded with python3-yaml. Every container whose command is `xdeepserve`
runs a subcommand listed by `xdeepserve --help` with only flags listed by
`xdeepserve SUBCOMMAND --help` (the binary's own help, not a list kept here). Then the pieces
must agree with each other and with what the binary requires:
  - prefill and decode instances are separate StatefulSets (--role prefill / decode), each
    governed by a headless Service of its own;
  - an instance listens on 0.0.0.0 and its readiness probe is GET /health on its
    --health-port; the gateway listens on --host 0.0.0.0 and its probe is GET /health on
    --port;
  - --cluster-secret-file lies in a volume made from a Secret whose mode has no group or other
    bits (the binary refuses the file otherwise), --model in a PersistentVolumeClaim volume;
  - each address of the gateway's --instances is a StatefulSet pod's DNS name
    (<set>-<i>.<service>.<namespace>.svc.cluster.local, i < replicas) on that set's --listen
    port;
  - deploy/prometheus.yml's DNS name is a headless Service over the gateway pods, on the
    gateway's port;
  - deploy/grafana/xdeepserve.json is what deploy/grafana/make_dashboard.py writes.
"""
import argparse
import glob
import os
import re
import subprocess
import sys

try:
    import yaml
except ImportError:
    yaml = None

FAILURES = []


def check(cond, what):
    if not cond:
        FAILURES.append(what)
        print(f"FAILED: {what}", file=sys.stderr)


def help_flags(xdeepserve, sub=None):
    """The --flags (and, for the top level, the subcommands) the binary's help lists."""
    argv = [xdeepserve] + ([sub] if sub else []) + ["--help"]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    check(r.returncode == 0, f"{' '.join(argv)} exited {r.returncode}: {r.stderr[-300:]}")
    return r.stdout


def subcommands(top_help):
    out, in_section = set(), False
    for line in top_help.splitlines():
        if line.strip().upper().startswith("SUBCOMMANDS"):
            in_section = True
            continue
        if in_section:
            m = re.match(r"\s+([a-z][a-z0-9-]*)\s", line + " ")
            if m:
                out.add(m.group(1))
            elif line.strip() and not line.startswith(" "):
                in_section = False
    return out


def flag_of(token):
    return token.split("=", 1)[0] if token.startswith("--") else None


def arg_value(argv, flag):
    for i, t in enumerate(argv):
        if t == flag and i + 1 < len(argv):
            return argv[i + 1]
        if t.startswith(flag + "="):
            return t.split("=", 1)[1]
    return None


def pod_spec(doc):
    if doc.get("kind") in ("Deployment", "StatefulSet"):
        return doc["spec"]["template"]["spec"]
    return None


def mount_volume(spec, container, path):
    """The volume (its spec) mounted at the deepest mountPath above `path`, or None."""
    best = None
    for m in container.get("volumeMounts", []):
        mp = m["mountPath"].rstrip("/")
        if path == mp or path.startswith(mp + "/"):
            if best is None or len(mp) > len(best["mountPath"]):
                best = m
    if best is None:
        return None
    return next((v for v in spec.get("volumes", []) if v["name"] == best["name"]), None)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--xdeepserve", required=True)
    ap.add_argument("--repo", required=True)
    args = ap.parse_args()
    if yaml is None:
        print("SKIP-FAIL: python3-yaml is not installed (tools/install_deps.sh installs it)",
              file=sys.stderr)
        return 1

    files = sorted(glob.glob(os.path.join(args.repo, "deploy", "k8s", "*.yaml")))
    check(files, "no manifests in deploy/k8s")
    docs = []
    for path in files:
        try:
            with open(path) as f:
                loaded = [d for d in yaml.safe_load_all(f) if d is not None]
        except yaml.YAMLError as e:
            check(False, f"{path} does not parse: {e}")
            continue
        for d in loaded:
            where = f"{os.path.basename(path)}: {d.get('kind')}/{d.get('metadata', {}).get('name')}"
            check(all(k in d for k in ("apiVersion", "kind", "metadata")),
                  f"{where}: apiVersion, kind and metadata needed")
            if d.get("kind") != "Namespace":
                check(d["metadata"].get("namespace") == "xdeepserve",
                      f"{where}: not in the namespace xdeepserve")
            docs.append((where, d))

    top = help_flags(args.xdeepserve)
    known_subs = subcommands(top)
    check({"gateway", "instance", "serve"} <= known_subs,
          f"xdeepserve --help lists subcommands {sorted(known_subs)}")
    flags_of = {}
    services = {d["metadata"]["name"]: d for _, d in docs if d["kind"] == "Service"}
    sets = {}      # StatefulSet name -> (doc, argv)
    gateways = []  # (where, doc, argv, container)
    for where, d in docs:
        spec = pod_spec(d)
        if spec is None:
            continue
        for c in spec["containers"]:
            cmd = list(c.get("command", [])) + list(c.get("args", []))
            if not cmd or os.path.basename(cmd[0]) != "xdeepserve":
                continue
            argv = [str(t) for t in cmd[1:]]
            check(argv and argv[0] in known_subs, f"{where}: unknown subcommand {argv[:1]}")
            if not argv or argv[0] not in known_subs:
                continue
            sub = argv[0]
            if sub not in flags_of:
                flags_of[sub] = set(re.findall(r"--[a-z0-9][a-z0-9-]*", help_flags(
                    args.xdeepserve, sub)))
            for t in argv[1:]:
                flag = flag_of(t)
                check(flag is None or flag in flags_of[sub],
                      f"{where}: `xdeepserve {sub}` has no flag {flag}")
            probe = c.get("readinessProbe", {}).get("httpGet", {})
            secret_file = arg_value(argv, "--cluster-secret-file")
            check(secret_file is not None, f"{where}: no --cluster-secret-file")
            if secret_file:
                v = mount_volume(spec, c, secret_file)
                check(v is not None and "secret" in v,
                      f"{where}: {secret_file} is not in a Secret volume")
                if v is not None and "secret" in v:
                    mode = v["secret"].get("defaultMode", 0o644)
                    check(mode & 0o077 == 0, f"{where}: the cluster secret's mode {mode:o} lets "
                                             "group or others read it (the binary refuses it)")
            model = arg_value(argv, "--model")
            v = mount_volume(spec, c, model or "")
            check(model and v is not None and "persistentVolumeClaim" in v,
                  f"{where}: --model {model} is not in a PersistentVolumeClaim volume")
            if sub == "instance":
                check(d["kind"] == "StatefulSet", f"{where}: instances run as StatefulSets")
                listen = arg_value(argv, "--listen") or ""
                check(listen.startswith("tcp://0.0.0.0:"), f"{where}: --listen {listen}")
                hp = arg_value(argv, "--health-port")
                check(hp is not None and probe.get("path") == "/health" and
                      str(probe.get("port")) == hp,
                      f"{where}: readiness probe {probe} is not GET /health on --health-port {hp}")
                sets[d["metadata"]["name"]] = (d, argv)
            elif sub == "gateway":
                check(arg_value(argv, "--host") == "0.0.0.0", f"{where}: --host not 0.0.0.0")
                check(probe.get("path") == "/health" and
                      str(probe.get("port")) == arg_value(argv, "--port"),
                      f"{where}: readiness probe {probe} is not GET /health on --port")
                gateways.append((where, d, argv))

    roles = {}
    for name, (d, argv) in sets.items():
        roles.setdefault(arg_value(argv, "--role") or "colocated", []).append(name)
        svc = services.get(d["spec"].get("serviceName"))
        check(svc is not None and svc["spec"].get("clusterIP") == "None",
              f"StatefulSet {name}: its serviceName is no headless Service")
        if svc is not None:
            sel = svc["spec"].get("selector", {})
            labels = d["spec"]["template"]["metadata"]["labels"]
            check(all(labels.get(k) == v for k, v in sel.items()),
                  f"Service {svc['metadata']['name']} does not select the pods of {name}")
    check(roles.get("prefill") and roles.get("decode") and
          not set(roles["prefill"]) & set(roles["decode"]),
          f"prefill and decode are not separate StatefulSets: {roles}")

    # Pod DNS name -> port, for every StatefulSet pod of an instance.
    pod_names = {}
    for name, (d, argv) in sets.items():
        port = (arg_value(argv, "--listen") or "").rsplit(":", 1)[-1]
        for i in range(d["spec"].get("replicas", 1)):
            pod_names[f"{name}-{i}.{d['spec']['serviceName']}.xdeepserve.svc.cluster.local"] = port
    check(gateways, "no gateway")
    gateway_port = None
    for where, d, argv in gateways:
        gateway_port = arg_value(argv, "--port")
        addresses = (arg_value(argv, "--instances") or arg_value(argv, "--instance") or "")
        for a in filter(None, addresses.split(",")):
            m = re.fullmatch(r"tcp://([^:]+):(\d+)", a)
            check(m is not None and pod_names.get(m.group(1)) == m.group(2),
                  f"{where}: --instances names {a}, which is no instance pod's --listen")
        listed = {re.sub(r"^tcp://|:\d+$", "", a) for a in addresses.split(",")}
        check(set(pod_names) <= listed, f"{where}: instances left out of --instances: "
                                        f"{sorted(set(pod_names) - listed)}")

    # deploy/prometheus.yml finds the gateways through a headless Service's DNS records.
    with open(os.path.join(args.repo, "deploy", "prometheus.yml")) as f:
        prom = yaml.safe_load(f)
    for job in prom["scrape_configs"]:
        for sd in job.get("dns_sd_configs", []):
            for name in sd["names"]:
                svc = services.get(name.split(".")[0])
                check(svc is not None and svc["spec"].get("clusterIP") == "None" and
                      name.endswith(".xdeepserve.svc.cluster.local"),
                      f"prometheus.yml: {name} is no headless Service of deploy/k8s")
                if svc is not None and gateways:
                    labels = gateways[0][1]["spec"]["template"]["metadata"]["labels"]
                    check(all(labels.get(k) == v for k, v in svc["spec"]["selector"].items()),
                          f"prometheus.yml: {name} does not select the gateway pods")
                check(str(sd.get("port")) == gateway_port,
                      f"prometheus.yml: port {sd.get('port')} is not the gateway's {gateway_port}")

    r = subprocess.run([sys.executable, os.path.join(args.repo, "deploy", "grafana",
                                                     "make_dashboard.py"), "--check"],
                       capture_output=True, text=True)
    check(r.returncode == 0, f"deploy/grafana/xdeepserve.json is stale: {r.stderr}")

    if FAILURES:
        print(f"{len(FAILURES)} check(s) failed", file=sys.stderr)
        return 1
    print(f"deploy: {len(docs)} objects in {len(files)} manifests; "
          f"{len(sets)} instance sets, {len(gateways)} gateway(s); flags as the binary lists")
    return 0


if __name__ == "__main__":
    sys.exit(main())
