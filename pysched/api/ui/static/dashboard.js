// pysched dashboard: refresh the page's tables every few seconds from its
// JSON view (the same URL with ?parts=1). Cells are written with
// textContent, never as markup: what the store holds stays text.
"use strict";
(() => {
  const every = Number(document.body.dataset.refreshMs || 0);
  if (!every) return;
  const updated = document.getElementById("updated");

  function bar(pct) {
    const ns = "http://www.w3.org/2000/svg";
    const svg = document.createElementNS(ns, "svg");
    svg.setAttribute("class", "bar");
    svg.setAttribute("viewBox", "0 0 100 10");
    svg.setAttribute("preserveAspectRatio", "none");
    svg.setAttribute("aria-hidden", "true");
    const rect = document.createElementNS(ns, "rect");
    rect.setAttribute("width", Math.max(0, Math.min(100, pct)).toFixed(1));
    rect.setAttribute("height", "10");
    svg.append(rect);
    return svg;
  }

  function form(post) {
    const f = document.createElement("form");
    f.method = "post";
    f.action = post.action;
    for (const [name, value] of Object.entries(post.fields)) {
      const input = document.createElement("input");
      input.type = "hidden";
      input.name = name;
      input.value = value;
      f.append(input);
    }
    const button = document.createElement("button");
    button.type = "submit";
    button.textContent = post.label;
    f.append(button);
    return f;
  }

  function cell(c) {
    const td = document.createElement("td");
    if (c.cls) td.className = c.cls;
    if (c.title) td.title = c.title;
    if (c.bar !== undefined) td.append(bar(c.bar));
    if (c.post) {
      td.append(form(c.post));
    } else if (c.href) {
      const a = document.createElement("a");
      a.href = c.href;
      a.textContent = c.text;
      td.append(a);
    } else if (c.details) {
      const details = document.createElement("details");
      const summary = document.createElement("summary");
      summary.textContent = c.text;
      const list = document.createElement("ul");
      for (const line of c.details) {
        const li = document.createElement("li");
        li.textContent = line;
        list.append(li);
      }
      details.append(summary, list);
      td.append(details);
    } else {
      td.append(document.createTextNode(c.text));
    }
    return td;
  }

  function rows(part, columns) {
    if (!part.rows.length) {
      const td = document.createElement("td");
      td.colSpan = columns;
      td.className = "empty";
      td.textContent = part.empty;
      const tr = document.createElement("tr");
      tr.append(td);
      return [tr];
    }
    return part.rows.map((row) => {
      const tr = document.createElement("tr");
      tr.append(...row.map(cell));
      return tr;
    });
  }

  function detailsKey(details) {
    const td = details.closest("td");
    return `${td.parentElement.firstElementChild.textContent}\t${td.cellIndex}`;
  }

  async function refresh() {
    if (document.hidden) return;
    const url = new URL(location.href);
    url.searchParams.set("parts", "1");
    let data;
    try {
      const response = await fetch(url, { headers: { accept: "application/json" }, cache: "no-store" });
      if (!response.ok || response.redirected) {
        updated.textContent = `refresh failed (HTTP ${response.status}${response.redirected ? ", log in again" : ""})`;
        return;
      }
      data = await response.json();
    } catch (err) {
      updated.textContent = `refresh failed (${err})`;
      return;
    }
    for (const tbody of document.querySelectorAll("tbody[data-part]")) {
      const part = data.parts[tbody.dataset.part];
      if (!part) continue;
      // What the reader unfolded stays unfolded: keyed by the row's first
      // cell (a job, a node) and the column.
      const opened = new Set([...tbody.querySelectorAll("details[open]")].map(detailsKey));
      tbody.replaceChildren(...rows(part, Number(tbody.dataset.columns)));
      for (const details of tbody.querySelectorAll("details")) {
        if (opened.has(detailsKey(details))) details.open = true;
      }
      const caption = document.querySelector(`[data-caption="${tbody.dataset.part}"]`);
      if (caption) caption.textContent = part.caption;
    }
    updated.textContent = data.updated;
    document.body.dataset.refreshed = String(Number(document.body.dataset.refreshed || 0) + 1);
  }

  setInterval(refresh, every);
})();
