// kvtier bench report: renders charts from the embedded record. No dependencies, no network.
(function () {
  "use strict";
  var R = JSON.parse(document.getElementById("record").textContent);
  var A = R.analysis || {};
  var tip = document.getElementById("tip");
  var rendered = 0, failures = 0;
  var DASHES = ["", "10 5", "3 4", "14 4 3 4", "1 3"];
  var COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"];

  function esc(s) {
    return String(s).replace(/[&<>"']/g, function (c) {
      return { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c];
    });
  }
  function fmt(v) {
    if (v === null || v === undefined || !isFinite(v)) return "–";
    var a = Math.abs(v);
    return a >= 1000 ? v.toFixed(0) : a >= 10 ? v.toFixed(1) : a >= 0.1 ? v.toFixed(2) : v.toPrecision(2);
  }
  // Axis labels: counts (concurrency, rates) as integers, everything else by magnitude.
  function tickFmt(v) { return Math.abs(v - Math.round(v)) < 1e-9 ? String(Math.round(v)) : fmt(v); }
  function closed(s) { return s.mode.kind === "closed"; }
  function load(s) { return closed(s) ? s.mode.concurrency * s.processes : s.mode.rate_per_s; }
  function label(s) {
    return closed(s) ? (s.processes > 1 ? "c=" + load(s) + " (" + s.processes + "×" + s.mode.concurrency + ")" : "c=" + load(s))
      : "rate=" + s.mode.rate_per_s + "/s";
  }
  function byLoad(steps, isClosed) {
    return steps.filter(function (s) { return closed(s) === isClosed; }).sort(function (a, b) { return load(a) - load(b); });
  }
  function opNames(steps) {
    var n = {};
    steps.forEach(function (s) { Object.keys(s.ops).forEach(function (k) { n[k] = 1; }); });
    return Object.keys(n).sort();
  }
  function e2e(op) { return (op.latency_us || {}).e2e || null; }

  // Scales: log2 for x when the sweep is wide, log10 optional for y.
  function scale(lo, hi, a, b, log) {
    var f = log ? function (v) { return Math.log(Math.max(v, 1e-9)); } : function (v) { return v; };
    var l = f(lo), h = f(hi);
    if (h === l) { h = l + 1; }
    return function (v) { return a + (f(v) - l) / (h - l) * (b - a); };
  }
  function ticks(lo, hi, log) {
    var out = [], k;
    if (log) {
      for (k = Math.floor(Math.log10(Math.max(lo, 1e-9))); k <= Math.ceil(Math.log10(hi)); k++) {
        [1, 2, 5].forEach(function (m) { var v = m * Math.pow(10, k); if (v >= lo * 0.999 && v <= hi * 1.001) out.push(v); });
      }
      return out;
    }
    var step = Math.pow(10, Math.floor(Math.log10((hi - lo) / 5 || 1)));
    [1, 2, 5, 10].some(function (m) { if ((hi - lo) / (m * step) <= 6) { step = m * step; return true; } return false; });
    for (k = Math.ceil(lo / step) * step; k <= hi + step * 1e-9; k += step) out.push(k);
    return out;
  }

  // spec: {title, xLabel, yLabel, series:[{name, points:[[x,y,tipText,flagged]], dashed, line}], logX, logY, canLogY, bars}
  function chart(spec) {
    var box = document.createElement("div");
    box.className = "chart";
    document.getElementById("charts").appendChild(box);
    var hidden = {};
    function draw() {
      var W = 720, H = 340, L = 70, Rm = 20, T = 15, B = 45;
      // The axes follow the measured points; fitted curves (line series) are
      // cut at the plot's edge instead of stretching it.
      var pts = [];
      spec.series.forEach(function (s, i) { if (!hidden[i] && !s.line) pts = pts.concat(s.points); });
      if (!pts.length) spec.series.forEach(function (s) { pts = pts.concat(s.points); });
      var xs = pts.map(function (p) { return p[0]; }), ys = pts.map(function (p) { return p[1] + (spec.bars ? p[4] || 0 : 0); });
      var xlo = Math.min.apply(null, xs), xhi = Math.max.apply(null, xs);
      var logY = spec.logY && Math.min.apply(null, ys) > 0;
      var ylo = logY ? Math.min.apply(null, ys) : 0, yhi = Math.max.apply(null, ys) * 1.05 || 1;
      var logX = spec.logX && xlo > 0;
      var sx = scale(xlo, xhi, L, W - Rm, logX), sy = scale(ylo, yhi, H - B, T, logY);
      var h = ['<svg viewBox="0 0 ' + W + " " + H + '" width="' + W + '" height="' + H + '" role="img">'];
      ticks(ylo, yhi, logY).forEach(function (v) {
        h.push('<line class="grid" x1="' + L + '" x2="' + (W - Rm) + '" y1="' + sy(v) + '" y2="' + sy(v) + '"/>' +
          '<text class="tick" x="' + (L - 6) + '" y="' + (sy(v) + 4) + '" text-anchor="end">' + tickFmt(v) + "</text>");
      });
      var xt = {};
      xs.forEach(function (v) { xt[v] = 1; });
      var xv = Object.keys(xt).map(Number).sort(function (a, b) { return a - b; });
      if (xv.length > 12) xv = ticks(xlo, xhi, logX);
      xv.forEach(function (v) {
        h.push('<text class="tick xt" x="' + sx(v) + '" y="' + (H - B + 16) + '" text-anchor="middle">' + tickFmt(v) + "</text>");
      });
      h.push('<line class="axis" x1="' + L + '" x2="' + (W - Rm) + '" y1="' + (H - B) + '" y2="' + (H - B) + '"/>');
      h.push('<line class="axis" x1="' + L + '" x2="' + L + '" y1="' + T + '" y2="' + (H - B) + '"/>');
      h.push('<text class="lbl" x="' + ((L + W - Rm) / 2) + '" y="' + (H - 8) + '" text-anchor="middle">' + esc(spec.xLabel) + "</text>");
      h.push('<text class="lbl" transform="translate(14,' + ((T + H - B) / 2) + ') rotate(-90)" text-anchor="middle">' + esc(spec.yLabel) + (logY ? " (log)" : "") + "</text>");
      var nb = spec.series.length, bw = spec.bars ? Math.max(4, Math.min(28, (W - L - Rm) / (xv.length + 1) / 1.5)) : 0;
      spec.series.forEach(function (s, i) {
        if (hidden[i]) return;
        var c = s.color || COLORS[i % COLORS.length];
        h.push('<g data-series="' + i + '">');
        if (spec.bars) {
          s.points.forEach(function (p) {
            var y0 = sy(p[4] || 0), y1 = sy((p[4] || 0) + p[1]);
            h.push('<rect x="' + (sx(p[0]) - bw / 2) + '" y="' + y1 + '" width="' + bw + '" height="' + Math.max(0, y0 - y1) +
              '" fill="' + c + '" data-tip="' + esc(s.name + " @ " + p[2] + ": " + fmt(p[1])) + '"/>');
          });
        } else {
          var inside = s.line ? s.points.filter(function (p) { return p[1] >= ylo && p[1] <= yhi && p[0] >= xlo && p[0] <= xhi; }) : s.points;
          var d = inside.map(function (p, k) { return (k ? "L" : "M") + sx(p[0]).toFixed(1) + "," + sy(p[1]).toFixed(1); }).join("");
          // Series of one chart differ by colour and dash pattern, so lines that
          // coincide (e.g. the three ops of the mixed workload) stay visible.
          var dash = s.dashed ? "6 4" : DASHES[i % DASHES.length];
          if (d) h.push('<path class="' + (s.line ? "fit" : "data") + '" d="' + d + '" fill="none" stroke="' + c + '" stroke-width="' + (s.line ? 1.5 : 2.5 - 0.4 * (i % 3)) + '"' + (dash ? ' stroke-dasharray="' + dash + '"' : "") + "/>");
          if (!s.line) {
            s.points.forEach(function (p) {
              h.push('<circle cx="' + sx(p[0]) + '" cy="' + sy(p[1]) + '" r="' + (p[3] ? 6 : 4) + '" fill="' + c + '"' +
                (p[3] ? ' class="flagged"' : "") + ' data-tip="' + esc(s.name + " @ " + p[2] + ": " + fmt(p[1]) + (p[3] ? " ⚠ flagged" : "")) + '"/>');
            });
          }
        }
        h.push("</g>");
      });
      h.push("</svg>");
      var leg = spec.series.map(function (s, i) {
        return '<span class="leg' + (hidden[i] ? " off" : "") + '" data-i="' + i + '"><i style="background:' + (s.color || COLORS[i % COLORS.length]) + '"></i>' + esc(s.name) + "</span>";
      }).join("");
      var tools = spec.canLogY ? '<label class="tool"><input type="checkbox"' + (spec.logY ? " checked" : "") + "> log y</label>" : "";
      box.innerHTML = "<h3>" + esc(spec.title) + "</h3><div class=\"legend\">" + leg + tools + "</div>" + h.join("") +
        (spec.note ? '<p class="note">' + esc(spec.note) + "</p>" : "");
      box.querySelector("svg").setAttribute("data-rendered", "1");
      Array.prototype.forEach.call(box.querySelectorAll(".leg"), function (el) {
        el.addEventListener("click", function () { var i = +el.getAttribute("data-i"); hidden[i] = !hidden[i]; draw(); });
      });
      var cb = box.querySelector("input");
      if (cb) cb.addEventListener("change", function () { spec.logY = cb.checked; draw(); });
    }
    try {
      draw();
      rendered++;
    } catch (e) {
      failures++;
      box.innerHTML = '<p class="err">chart "' + esc(spec.title) + '" failed: ' + esc(e && e.message) + "</p>";
    }
  }

  document.addEventListener("mousemove", function (ev) {
    var t = ev.target && ev.target.getAttribute && ev.target.getAttribute("data-tip");
    if (t) {
      tip.textContent = t;
      tip.style.display = "block";
      tip.style.left = ev.pageX + 12 + "px";
      tip.style.top = ev.pageY + 12 + "px";
    } else {
      tip.style.display = "none";
    }
  });

  function pointsOf(steps, f) {
    var out = [];
    steps.forEach(function (s) { var v = f(s); if (v !== null && v !== undefined && isFinite(v)) out.push([load(s), v, label(s), s.flags && s.flags.length > 0]); });
    return out;
  }
  function wide(steps) { return steps.length > 1 && load(steps[steps.length - 1]) / Math.max(load(steps[0]), 1e-9) >= 8; }
  function ms(us) { return us === null || us === undefined ? null : us / 1000; }

  var cs = byLoad(R.steps, true), os = byLoad(R.steps, false), ops = opNames(R.steps);

  // 1. Percentiles vs concurrency per op.
  ops.forEach(function (op) {
    if (!cs.length) return;
    chart({
      title: op + ": latency percentiles vs concurrency", xLabel: "total concurrency", yLabel: "latency (ms)",
      logX: wide(cs), logY: false, canLogY: true,
      series: ["p50", "p90", "p99", "p999"].map(function (q) {
        return { name: op + " " + q, points: pointsOf(cs, function (s) { var o = s.ops[op]; return o && e2e(o) ? ms(e2e(o)[q]) : null; }) };
      })
    });
  });

  // 2. Throughput vs concurrency with USL fits.
  if (cs.length) {
    var series = ops.map(function (op) {
      return { name: op + " ops/s", points: pointsOf(cs, function (s) { return s.ops[op] ? s.ops[op].throughput_ops_s : null; }) };
    });
    if (ops.length > 1) series.push({ name: "all ops/s", points: pointsOf(cs, function (s) { return Object.keys(s.ops).reduce(function (a, k) { return a + s.ops[k].throughput_ops_s; }, 0); }) });
    var same = ops.length > 1 && cs.every(function (s) {
      var v = ops.map(function (op) { return s.ops[op] ? s.ops[op].throughput_ops_s : null; });
      return v.every(function (x) { return x !== null && Math.abs(x - v[0]) <= 0.01 * Math.max(v[0], 1e-9); });
    });
    var tnote = same ? "The " + ops.join(", ") + " lines coincide: each iteration of this workload issues one of each. " : "";
    // A fit is drawn only when it explains the points (R² >= 0.8); a poor one
    // is named with its R², not drawn as if it meant something.
    var fits = (A.usl || []).filter(function (u) { return u.fit.r_squared >= 0.8; });
    var poor = (A.usl || []).filter(function (u) { return u.fit.r_squared < 0.8; });
    tnote += fits.length ? "Dashed: Universal Scalability Law fits (" + fits.map(function (u) { return u.op + " R² " + u.fit.r_squared.toFixed(3); }).join(", ") + "). "
      : (A.usl || []).length ? "" : "No scalability fit: it needs more load steps (" + cs.length + ") than its 3 parameters. ";
    if (poor.length) tnote += "Not drawn, the USL does not fit these points: " + poor.map(function (u) { return u.op + " R² " + u.fit.r_squared.toFixed(3); }).join(", ") + ".";
    fits.forEach(function (u) {
      var f = u.fit, lo = load(cs[0]), hi = load(cs[cs.length - 1]), pts = [];
      for (var k = 0; k <= 60; k++) {
        var n = wide(cs) ? lo * Math.pow(hi / lo, k / 60) : lo + (hi - lo) * k / 60;
        pts.push([n, f.lambda * n / (1 + f.sigma * (n - 1) + f.kappa * n * (n - 1)), "N=" + fmt(n)]);
      }
      series.push({ name: "USL fit " + u.op + " (σ=" + f.sigma.toFixed(3) + ", κ=" + f.kappa.toExponential(2) + ")", points: pts, dashed: true, line: true });
    });
    chart({ title: "Throughput vs concurrency", xLabel: "total concurrency", yLabel: "ops/s", logX: wide(cs), series: series, note: tnote });
  }

  // 3. Stacked phase breakdown (means are additive; percentiles are not).
  var PH = ["client_queue", "network", "server_queue", "service_excl_storage", "storage"];
  ops.forEach(function (op) {
    if (!cs.length) return;
    var base = {};
    var ser = PH.map(function (ph) {
      return {
        name: ph, points: pointsOf(cs, function (s) {
          var o = s.ops[op], L = o ? o.latency_us || {} : {};
          var v = ph === "service_excl_storage" ? (L.server_service ? Math.max(0, L.server_service.mean - (L.storage ? L.storage.mean : 0)) : null)
            : (L[ph] ? L[ph].mean : null);
          return ms(v);
        }).map(function (p) { p.push(base[p[0]] || 0); base[p[0]] = (base[p[0]] || 0) + p[1]; return p; })
      };
    }).filter(function (s) { return s.points.length; });
    if (ser.length) chart({ title: op + ": mean latency by phase", xLabel: "total concurrency", yLabel: "mean latency (ms)", logX: wide(cs), bars: true, series: ser,
      note: "Stacked means (additive); server_service is split into storage and the rest." });
  });

  // 4. Bandwidth vs the link probe.
  var steps = cs.length ? cs : os;
  if (steps.length) {
    var bws = ops.map(function (op) { return { name: op + " Gbit/s", points: pointsOf(steps, function (s) { return s.ops[op] ? s.ops[op].bytes_per_s * 8 / 1e9 : null; }) }; });
    bws.push({ name: "total Gbit/s", points: pointsOf(steps, function (s) { return Object.keys(s.ops).reduce(function (a, k) { return a + s.ops[k].bytes_per_s; }, 0) * 8 / 1e9; }) });
    var note = "No TCP probe in this run.";
    if (R.link_probe) {
      var g = R.link_probe.gbit_per_s;
      var local = /^(grpc|http|redis):\/\/(127\.|localhost|\[::1\])/.test(R.target);
      bws.push({ name: "raw TCP probe " + fmt(g) + " Gbit/s", points: pointsOf(steps, function () { return g; }), dashed: true, line: true, color: "#000" });
      note = "Probe: " + R.link_probe.method + ". " + (local
        ? "The target is on this host, so the probe measures the same loopback path: at the highest load kvtier moved " +
          fmt(bws[bws.length - 2].points.slice(-1)[0][1] / g * 100) + "% of raw TCP's throughput."
        : "The target is remote: the probe is not the client–server path, so no utilisation is given.");
    }
    chart({ title: "Bandwidth vs load", xLabel: cs.length ? "total concurrency" : "rate (req/s)", yLabel: "Gbit/s", logX: wide(steps), series: bws, note: note });
  }

  // 5. kvtier vs competitor.
  (R.peers || []).forEach(function (competitor) {
    if (!competitor.steps || !competitor.steps.length) return;
    var pc = byLoad(competitor.steps, true), map = competitor.op_map || {};
    Object.keys(map).forEach(function (kop) {
      var pop = map[kop];
      [["throughput_ops_s", "ops/s"], ["p50", "p50 (ms)"], ["p99", "p99 (ms)"]].forEach(function (m) {
        var get = function (op) { return function (s) { var o = s.ops[op]; if (!o) return null; return m[0] === "throughput_ops_s" ? o.throughput_ops_s : (e2e(o) ? ms(e2e(o)[m[0]]) : null); }; };
        chart({ title: "kvtier " + kop + " vs " + competitor.name + " " + pop + ": " + m[1], xLabel: "total concurrency", yLabel: m[1], logX: wide(cs),
          canLogY: m[0] !== "throughput_ops_s",
          series: [{ name: "kvtier " + kop, points: pointsOf(cs, get(kop)) }, { name: competitor.name + " " + pop, points: pointsOf(pc, get(pop)) }] });
      });
    });
  });

  // 6. Open loop: corrected vs uncorrected p99 vs rate.
  ops.forEach(function (op) {
    if (!os.length) return;
    chart({ title: op + ": open loop p99, corrected vs uncorrected", xLabel: "rate (req/s)", yLabel: "p99 (ms)", logX: wide(os), canLogY: true,
      series: [
        { name: "corrected (from intended start)", points: pointsOf(os, function (s) { var o = s.ops[op]; return o && e2e(o) ? ms(e2e(o).p99) : null; }) },
        { name: "uncorrected (from send)", points: pointsOf(os, function (s) { var o = s.ops[op]; return o && o.e2e_uncorrected_us ? ms(o.e2e_uncorrected_us.p99) : null; }) }
      ] });
  });

  document.body.dataset.chartErrors = String(failures);
  document.body.dataset.chartsRendered = String(rendered);
})();
