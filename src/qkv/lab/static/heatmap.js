// Heatmap: qkv.attention's weights for one head, with row sums and per-row entropy in the margin.
"use strict";

(async () => {
  const controls = document.getElementById("controls");
  const figure = document.getElementById("figure");
  const summary = document.getElementById("summary");
  const headSelect = controls.querySelector("[name=head]");
  let maskSpec = () => ({ mask: "none", mask_params: {} });

  const limits = await Lab.api("limits");
  for (const name of ["n_q", "n_k"]) controls.querySelector(`[name=${name}]`).max = String(limits.max_n);
  controls.querySelector("[name=heads]").max = String(Math.min(8, limits.max_heads));
  Lab.bindOutputs(controls);

  function heads(n) {
    const keep = headSelect.value;
    headSelect.innerHTML = "";
    for (let h = 0; h < n; h++) {
      const opt = document.createElement("option");
      opt.value = String(h); opt.textContent = `head ${h}`;
      headSelect.appendChild(opt);
    }
    const all = document.createElement("option");
    all.value = "all"; all.textContent = "all heads";
    headSelect.appendChild(all);
    headSelect.value = keep !== "" && (keep === "all" || Number(keep) < n) ? keep : "0";
  }

  function draw(r) {
    figure.innerHTML = "";
    heads(r.heads);
    const shown = headSelect.value === "all" ? [...Array(r.heads).keys()] : [Number(headSelect.value)];
    const labels = (n, p) => [...Array(n).keys()].map((i) => p + i);
    const weights = shown.length > 1 ? 260 : 520;
    for (const h of shown) {
      const w = r.weights[h].map((row, i) => row.map((x, j) => (r.allowed && !r.allowed[i][j] ? null : x)));
      Lab.heatmap(figure, w, {
        title: `head ${h}: A (${r.n_q} × ${r.n_k})`, min: 0, max: 1, width: weights,
        rowLabels: labels(r.n_q, "q"), colLabels: labels(r.n_k, "k"), xLabel: "weight (hatched: hidden by the mask)",
        margin: [{ label: "Σⱼ A", values: r.row_sums[h], max: 1 },
                 { label: "H / log n", values: r.entropy_normalised[h], max: 1 }],
      });
    }
    figure.dataset.digest = Lab.digest([r.weights, shown]);
    summary.textContent = `scale ${Lab.fmt(r.scale)} · temperature ${Lab.fmt(r.temperature, 3)} · mask ` +
      `${r.mask_name || "none"} · mean entropy ${Lab.fmt(r.entropy.flat().reduce((a, b) => a + b, 0) / (r.heads * r.n_q), 3)} nats`;
  }

  let last = null;
  headSelect.addEventListener("change", () => { if (last) draw(last); });
  Lab.live(controls, async () => {
    const scale = controls.querySelector("[name=scale]").value.trim();
    const body = {
      n_q: Lab.value(controls, "n_q"), n_k: Lab.value(controls, "n_k"), d: Lab.value(controls, "d"),
      heads: Lab.value(controls, "heads"), seed: Lab.value(controls, "seed"),
      temperature: Number(Lab.value(controls, "temperature").toPrecision(4)), ...maskSpec(),
    };
    if (scale !== "") body.scale = Number.isFinite(Number(scale)) ? Number(scale) : scale;
    const r = await Lab.api("heatmap", body);
    return () => { last = r; draw(r); };
  }, 40);
  maskSpec = await Lab.maskControls(document.getElementById("mask"), "causal");
  controls.dispatchEvent(new Event("change"));
})().catch((e) => Lab.showError(e.message));
