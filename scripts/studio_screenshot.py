"""Screenshot what `langgraph dev` serves to LangGraph Studio, with headless Chromium (docs/studio.md).

LangGraph Studio's web UI is served from smith.langchain.com; where that cannot be reached (our
machines reach only the package registries) the UI itself cannot be shown. What can be shown is
what the local server hands Studio: this script starts the real `langgraph dev` from the
repository root, reads ``/assistants/search``, ``/assistants/{id}/graph`` and
``/assistants/{id}/schemas``, and renders them on one local page: the graph's nodes and edges
(drawn with mermaid when ``--mermaid mermaid.min.js`` is given, e.g. from ``npm install mermaid``)
and the fields of the input form and of the run context, with the types, choices, defaults and
descriptions Studio builds its forms from. The page says plainly that it is not the Studio UI.

    python scripts/studio_screenshot.py --out docs/img/studio_served.png --mermaid node_modules/mermaid/dist/mermaid.min.js
"""
from __future__ import annotations

import argparse
import html
import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from langgraph_server import langgraph_dev  # noqa: E402


def http(url: str, body: dict | None = None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as reply:
        return json.loads(reply.read())


def mermaid_text(graph: dict) -> str:
    lines = ["flowchart TD"]
    for node in graph["nodes"]:
        label = node["id"].strip("_") if node["id"].startswith("__") else node["id"]
        lines.append(f'  {node["id"]}(["{label}"])' if node["id"].startswith("__") else f'  {node["id"]}["{label}"]')
    for edge in graph["edges"]:
        arrow = "-.->" if edge.get("conditional") else "-->"
        lines.append(f"  {edge['source']} {arrow} {edge['target']}")
    return "\n".join(lines)


def field_rows(schema: dict) -> str:
    rows = []
    for name, prop in schema.get("properties", {}).items():
        kinds = [p.get("type") for p in prop.get("anyOf", [])] or [prop.get("type", "any")]
        kind = " | ".join(str(k) for k in kinds if k)
        if "enum" in prop:
            kind = " / ".join(prop["enum"])
        default = prop.get("default", "")
        rows.append(f"<tr><td><code>{html.escape(name)}</code></td><td>{html.escape(kind or 'any')}</td>"
                    f"<td>{html.escape(json.dumps(default) if default != '' else '')}</td>"
                    f"<td>{html.escape(prop.get('description', ''))}</td></tr>")
    return "\n".join(rows)


def page(url: str, assistant: dict, graph: dict, schemas: dict, mermaid_js: Path | None) -> str:
    diagram = (f"<pre class='mermaid'>{html.escape(mermaid_text(graph))}</pre>"
               f"<script>{mermaid_js.read_text()}</script><script>mermaid.initialize({{startOnLoad: true}});</script>"
               if mermaid_js else
               "<ul>" + "".join(f"<li>{html.escape(e['source'])} &rarr; {html.escape(e['target'])}</li>"
                                for e in graph["edges"]) + "</ul>")
    return f"""<!DOCTYPE html><html><head><meta charset="utf-8"><style>
body {{ font: 13px system-ui, sans-serif; margin: 14px; color: #222; }}
.note {{ background: #fff4d6; border: 1px solid #e0c060; padding: 6px 10px; margin-bottom: 10px; }}
.grid {{ display: grid; grid-template-columns: 300px 1fr; gap: 16px; }}
table {{ border-collapse: collapse; width: 100%; margin-bottom: 12px; }}
td, th {{ border: 1px solid #ccc; padding: 3px 6px; vertical-align: top; text-align: left; }}
th {{ background: #f0f0f0; }} h2 {{ font-size: 14px; margin: 6px 0; }} code {{ font-size: 12px; }}
</style></head><body>
<div class="note"><b>Not the Studio UI.</b> LangGraph Studio's web app is served from smith.langchain.com, which this
machine cannot reach. Below is what the real <code>langgraph dev</code> server at <code>{html.escape(url)}</code> serves to
Studio for assistant <code>{html.escape(assistant['assistant_id'])}</code> (graph <code>{html.escape(assistant['graph_id'])}</code>):
<code>GET /assistants/{{id}}/graph</code> and <code>GET /assistants/{{id}}/schemas</code>, rendered on a local page.</div>
<div class="grid"><div><h2>The graph (nodes route themselves: dotted = Command goto)</h2>{diagram}</div><div>
<h2>Input form (<code>input_schema</code>: what a run starts from)</h2>
<table><tr><th>field</th><th>type / choices</th><th>default</th><th>description</th></tr>{field_rows(schemas['input_schema'])}</table>
<h2>Run context (<code>context_schema</code>: "Manage Assistants" &rarr; context)</h2>
<table><tr><th>field</th><th>type / choices</th><th>default</th><th>description</th></tr>{field_rows(schemas['context_schema'])}</table>
</div></div></body></html>"""


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(ROOT / "docs" / "img" / "studio_served.png"))
    p.add_argument("--mermaid", default=None, help="path of mermaid.min.js to draw the graph (optional)")
    p.add_argument("--chromium", default=shutil.which("chromium") or shutil.which("chromium-browser") or "chromium")
    p.add_argument("--size", default="1500,1250", help="window size WIDTH,HEIGHT (default: %(default)s)")
    args = p.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="sparseditto-studio-"))
    env = dict(os.environ, SPARSEDITTO_CACHE_DIR=str(work / "cache"))
    try:
        with langgraph_dev(env, work / "server.log", timeout=180) as url:
            assistant = next(a for a in http(url + "/assistants/search", {}) if a["graph_id"] == "sparseditto")
            graph = http(f"{url}/assistants/{assistant['assistant_id']}/graph")
            schemas = http(f"{url}/assistants/{assistant['assistant_id']}/schemas")
        html_path = work / "served.html"
        html_path.write_text(page(url, assistant, graph, schemas, Path(args.mermaid) if args.mermaid else None))
        out = Path(args.out).resolve()
        out.parent.mkdir(parents=True, exist_ok=True)
        shot = subprocess.run([args.chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                               f"--window-size={args.size}", "--virtual-time-budget=5000", f"--screenshot={out}",
                               html_path.as_uri()], capture_output=True, text=True, timeout=120)
        if shot.returncode != 0 or not out.exists():
            raise SystemExit(f"chromium failed: {shot.stderr[-2000:]}")
        print(f"wrote {out} ({out.stat().st_size} bytes) from {url}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
