// Positional encodings: qkv.positional's tables and what they do to a dot product.
"use strict";

(async () => {
  const controls = document.getElementById("controls");
  const figure = document.getElementById("figure");
  const about = document.getElementById("explain-kind");
  const TEXT = {
    sinusoidal: "PE[pos, 2i] = sin(pos / base^(2i/d)), PE[pos, 2i+1] = cos(…): each pair of features turns at its own speed. Right: PE[m] · PE[n] depends mostly on m − n.",
    rope: "RoPE rotates feature pair c by the angle pos · base^(−2c/d) (left, unwrapped). Right: the same q and k placed at every position: rope(q, m) · rope(k, n) depends only on m − n, so every diagonal is constant.",
    alibi: "ALiBi adds −slope · |i − j| to the scores of each head: no embedding, a distance penalty whose slope halves from head to head.",
    learned: "The position table P (max_len × d_model) of your last training run with pos = learned (Training page), and the cosine similarity of its rows.",
  };

  const limits = await Lab.api("limits");
  controls.querySelector("[name=n]").max = String(limits.max_n);
  Lab.bindOutputs(controls);

  function visible() {
    const kind = Lab.value(controls, "kind");
    for (const node of controls.querySelectorAll("[data-for]")) {
      node.style.display = node.dataset.for.split(" ").includes(kind) ? "" : "none";
    }
    about.textContent = TEXT[kind];
  }
  controls.querySelector("[name=kind]").addEventListener("change", visible);
  visible();

  function draw(r) {
    figure.innerHTML = "";
    const pos = (n, p) => [...Array(n).keys()].map((i) => p + i);
    if (r.kind === "alibi") {
      r.biases.forEach((b, h) => Lab.heatmap(figure, b, {
        title: `head ${h}: slope ${Lab.fmt(r.slopes[h], 4)}`, width: 230, rowLabels: pos(r.n, ""), xLabel: "bias",
      }));
    } else {
      const table = r.table;
      Lab.heatmap(figure, table, { title: r.table_label + ` (${table.length} × ${table[0].length})`, diverging: true,
                                   width: 420, rowLabels: pos(table.length, ""), xLabel: "feature →" });
      Lab.heatmap(figure, r.similarity, { title: r.similarity_label, diverging: true, width: 420,
                                          rowLabels: pos(r.similarity.length, ""), colLabels: pos(r.similarity.length, "") });
    }
    figure.dataset.digest = Lab.digest(r.kind === "alibi" ? r.biases : [r.table, r.similarity]);
    figure.dataset.kind = r.kind;
  }

  Lab.live(controls, async () => {
    const body = { kind: Lab.value(controls, "kind"), n: Lab.value(controls, "n") };
    if (body.kind === "sinusoidal" || body.kind === "rope") {
      body.d = Lab.value(controls, "d");
      body.base = Number(Lab.value(controls, "base").toPrecision(4));
    }
    if (body.kind === "alibi") { body.heads = Lab.value(controls, "heads"); body.causal = Lab.value(controls, "causal"); }
    if (body.kind === "rope") body.seed = Lab.value(controls, "seed");
    try {
      const r = await Lab.api("positional", body);
      return () => draw(r);
    } catch (e) {
      if (e.status === 409) { figure.innerHTML = ""; figure.dataset.digest = ""; }
      throw e;
    }
  }, 40);
  controls.dispatchEvent(new Event("change"));
})().catch((e) => Lab.showError(e.message));
