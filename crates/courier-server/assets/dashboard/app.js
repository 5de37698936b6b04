/*
 * Courier's web dashboard: one page over the JSON API under /v1.
 *
 * No framework and no build step. The page runs under a strict
 * Content-Security-Policy (no inline script or style, no eval), so every
 * handler is attached here. Everything the API returns (payloads, names,
 * error messages) is attacker-controlled: it reaches the page only through
 * textContent and setAttribute (see `h`), never through innerHTML.
 *
 * Pages are chosen by the location hash (`#/messages?state=dead`), so
 * filters survive a reload and can be linked. Each page gets a context
 * (`ctx`) whose timers stop and whose late answers are dropped once the
 * operator navigates away.
 */
(() => {
  'use strict';

  const PAGE_SIZE = 50;
  const HOUR_MS = 3600 * 1000;

  // ------------------------------------------------------------ DOM helpers

  const byId = (id) => document.getElementById(id);
  const SVG_NS = 'http://www.w3.org/2000/svg';

  /**
   * An element with attributes and children. `onX` attributes given a
   * function become listeners; `true` sets an empty attribute; null, undefined
   * and false are skipped. Children are nodes or text (set as text nodes,
   * never parsed as HTML); arrays are flattened.
   */
  function h(tag, attrs, ...children) {
    return build(document.createElement(tag), attrs, children);
  }

  /** The same for an SVG element. */
  function svg(tag, attrs, ...children) {
    return build(document.createElementNS(SVG_NS, tag), attrs, children);
  }

  function build(el, attrs, children) {
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value == null || value === false) continue;
      if (name.startsWith('on') && typeof value === 'function') {
        el.addEventListener(name.slice(2), value);
      } else {
        el.setAttribute(name, value === true ? '' : String(value));
      }
    }
    for (const child of children.flat(Infinity)) {
      if (child == null || child === false) continue;
      el.append(child instanceof Node ? child : String(child));
    }
    return el;
  }

  const mono = (text) => h('span', { class: 'mono' }, text);
  const dash = () => h('span', { class: 'muted' }, '—');
  const loading = () => h('p', { class: 'muted' }, 'Loading…');
  const empty = (text) => h('p', { class: 'empty', 'data-test': 'empty' }, text);
  const enc = encodeURIComponent;

  /** A link to a page of the dashboard: `path` is already encoded. */
  function link(path, params, ...children) {
    const query = qs(params || {});
    return h('a', { href: `#/${path}${query ? `?${query}` : ''}` }, children);
  }

  function title(...children) {
    const el = h('h1', { 'data-test': 'page-title' }, children);
    document.title = `${el.textContent} · Courier`;
    return el;
  }

  function panel(heading, ...children) {
    return h('section', { class: 'panel' }, heading ? h('h2', {}, heading) : null, children);
  }

  function badge(state, text) {
    return h('span', { class: `badge ${state}` }, text ?? state);
  }

  /** A table; a heading given as [text, 'num'] is right-aligned. */
  function table(test, headings, rows, foot) {
    const th = (x) => (Array.isArray(x) ? h('th', { class: x[1] }, x[0]) : h('th', {}, x));
    return h('table', { class: 'data', 'data-test': test },
      h('thead', {}, h('tr', {}, headings.map(th))),
      h('tbody', {}, rows),
      foot ? h('tfoot', {}, foot) : null);
  }

  const td = (...children) => h('td', {}, children);
  const numTd = (value, field) =>
    h('td', { class: 'num', 'data-field': field }, value == null ? '—' : String(value));

  /** A definition list of [label, value, data-test] rows. */
  function fields(rows) {
    return h('dl', { class: 'fields' }, rows.map(([label, value, test]) => [
      h('dt', {}, label),
      h('dd', { 'data-test': test }, value == null || value === '' ? dash() : value),
    ]));
  }

  // --------------------------------------------------------------- formatting

  /** A duration in seconds as operators read it: 3s, 4m 10s, 2h 5m, 3d 4h. */
  function humanAge(seconds) {
    if (seconds == null || !Number.isFinite(seconds)) return '—';
    const s = Math.max(0, Math.floor(seconds));
    if (s < 60) return `${s}s`;
    if (s < 3600) return `${Math.floor(s / 60)}m ${s % 60}s`;
    if (s < 86400) return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
    return `${Math.floor(s / 86400)}d ${Math.floor((s % 86400) / 3600)}h`;
  }

  const pad = (n) => String(n).padStart(2, '0');

  /** An RFC 3339 time in the browser's zone, to the second. */
  function localTime(iso) {
    const d = new Date(iso);
    if (Number.isNaN(d.getTime())) return String(iso);
    return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} `
      + `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
  }

  /** A <time> showing local time, with the exact UTC value on hover. */
  function timeEl(iso, withAgo) {
    if (!iso) return dash();
    const ago = withAgo ? ` (${humanAge((Date.now() - Date.parse(iso)) / 1000)} ago)` : '';
    return h('time', { datetime: iso, title: iso }, localTime(iso) + ago);
  }

  /** The value of a datetime-local input (local time) for an RFC 3339 time. */
  function toLocalInput(iso) {
    const d = new Date(iso);
    if (!iso || Number.isNaN(d.getTime())) return '';
    return localTime(iso).replace(' ', 'T');
  }

  /** A datetime-local input's value (local time) as RFC 3339 UTC. */
  function fromLocalInput(value) {
    const d = new Date(value); // a date-time without offset is local time
    return value && !Number.isNaN(d.getTime()) ? d.toISOString() : '';
  }

  const percent = (rate) => `${Math.round(rate * 100)} %`;
  const plural = (n, one, many = `${one}s`) => `${n} ${n === 1 ? one : many}`;

  /** A query string of the non-empty values of `params`. */
  function qs(params) {
    const kept = Object.entries(params).filter(([, v]) => v != null && v !== '');
    return new URLSearchParams(kept).toString();
  }

  // ------------------------------------------------ JSON with exact numbers

  /*
   * `JSON.parse` turns every number into a double, so an integer beyond
   * 2^53 in a payload would be shown rounded. This parser keeps each number
   * and string as its source text; objects keep their key order. Nodes:
   *   {t: 'o', e: [[key, keySource, node], ...]}   object
   *   {t: 'a', e: [node, ...]}                     array
   *   {t: 's' | 'n' | 'l', raw}                    string, number, literal
   */
  const NUMBER = /-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?/y;
  const SPACE = /[ \t\n\r]*/y;

  /** Deeper than this, a value is kept as its text (see skipNested): the
   * parser and the printers recurse, and a payload may nest thousands deep. */
  const MAX_DEPTH = 200;

  function parseJson(text) {
    let i = 0;
    let depth = 0;
    const fail = (what) => { throw new SyntaxError(`bad JSON from the server: ${what} at ${i}`); };
    const skip = () => { SPACE.lastIndex = i; SPACE.exec(text); i = SPACE.lastIndex; };
    const expect = (c) => { skip(); if (text[i] !== c) fail(`expected '${c}'`); i += 1; };

    function string() {
      const start = i;
      i += 1; // the opening quote
      for (;;) {
        const c = text.charCodeAt(i);
        if (c === 34) break; // closing quote
        if (Number.isNaN(c) || c < 32) fail('unterminated string');
        i += c === 92 ? 2 : 1; // a backslash escapes the next character
      }
      i += 1;
      return text.slice(start, i);
    }

    function list(close, item) {
      const e = [];
      skip();
      if (text[i] === close) { i += 1; return e; }
      for (;;) {
        e.push(item());
        skip();
        const c = text[i];
        i += 1;
        if (c === close) return e;
        if (c !== ',') fail(`expected ',' or '${close}'`);
      }
    }

    /** The text of the object or array at `i`, found without recursion. */
    function skipNested() {
      const start = i;
      let level = 0;
      for (;;) {
        const c = text[i];
        if (c === undefined) fail('unterminated value');
        if (c === '"') { string(); continue; }
        i += 1;
        if (c === '{' || c === '[') level += 1;
        if ((c === '}' || c === ']') && (level -= 1) === 0) return text.slice(start, i);
      }
    }

    function value() {
      skip();
      const c = text[i];
      if ((c === '{' || c === '[') && depth >= MAX_DEPTH) return { t: 'r', raw: skipNested() };
      if (c === '{') {
        i += 1;
        depth += 1;
        const node = { t: 'o', e: list('}', () => {
          skip();
          if (text[i] !== '"') fail('expected a key');
          const raw = string();
          expect(':');
          return [JSON.parse(raw), raw, value()];
        }) };
        depth -= 1;
        return node;
      }
      if (c === '[') {
        i += 1;
        depth += 1;
        const node = { t: 'a', e: list(']', value) };
        depth -= 1;
        return node;
      }
      if (c === '"') return { t: 's', raw: string() };
      if (c === '-' || (c >= '0' && c <= '9')) {
        NUMBER.lastIndex = i;
        const m = NUMBER.exec(text);
        if (!m) fail('bad number');
        i = NUMBER.lastIndex;
        return { t: 'n', raw: m[0] };
      }
      for (const raw of ['true', 'false', 'null']) {
        if (text.startsWith(raw, i)) { i += raw.length; return { t: 'l', raw }; }
      }
      return fail('unexpected character');
    }

    const root = value();
    skip();
    if (i !== text.length) fail('trailing text');
    return root;
  }

  /** A node as a plain value (numbers as doubles: only for small fields). */
  function plain(node) {
    switch (node.t) {
      case 'o': return Object.fromEntries(node.e.map(([key, , v]) => [key, plain(v)]));
      case 'a': return node.e.map(plain);
      case 'n': return Number(node.raw);
      default: return JSON.parse(node.raw);
    }
  }

  /** The member `key` of an object node. */
  function member(node, key) {
    const entry = node && node.t === 'o' ? node.e.find(([k]) => k === key) : null;
    return entry ? entry[2] : { t: 'l', raw: 'null' };
  }

  /** A node as JSON text with 2-space indentation, numbers as stored. */
  function pretty(node, indent = '') {
    const inner = `${indent}  `;
    if (node.t === 'o') {
      if (!node.e.length) return '{}';
      const lines = node.e.map(([, raw, v]) => `${inner}${raw}: ${pretty(v, inner)}`);
      return `{\n${lines.join(',\n')}\n${indent}}`;
    }
    if (node.t === 'a') {
      if (!node.e.length) return '[]';
      return `[\n${node.e.map((v) => inner + pretty(v, inner)).join(',\n')}\n${indent}]`;
    }
    return node.raw;
  }

  // ---------------------------------------------------------------------- API

  class ApiError extends Error {
    constructor(status, message, field, code) {
      super(message);
      this.status = status;
      this.field = field || null;
      this.code = code || null;
    }
  }

  /**
   * Calls the API with the session cookie. State changes always send a JSON
   * body (`{}` when the route takes none): the server refuses others (415).
   * A 401 ends the session and shows the sign-in form, unless `signIn` says
   * this call is part of signing in. `text` answers the body unparsed.
   */
  async function api(method, path, { body, text = false, signIn = false } = {}) {
    const init = { method, credentials: 'same-origin', headers: { Accept: 'application/json' } };
    if (method !== 'GET') {
      init.headers['Content-Type'] = 'application/json';
      init.body = JSON.stringify(body ?? {});
    }
    let response;
    try {
      response = await fetch(path, init);
    } catch (err) {
      throw new ApiError(0, `The daemon did not answer (${err.message}).`);
    }
    if (response.status === 401 && !signIn) {
      sessionLost();
      const lost = new ApiError(401, 'Signed out.');
      lost.auth = true;
      throw lost;
    }
    if (!response.ok) throw await errorOf(response);
    if (response.status === 204) return null;
    return text ? response.text() : response.json();
  }

  async function errorOf(response) {
    try {
      const { error } = await response.json();
      if (error && error.message) {
        return new ApiError(response.status, error.message, error.field, error.code);
      }
    } catch (_) { /* not the API's error body */ }
    return new ApiError(response.status, `HTTP ${response.status} ${response.statusText}`);
  }

  // ------------------------------------------------ session, banners, dialog

  let session = null; // the answer of GET /v1/session while signed in
  const isAdmin = () => session.roles.includes('admin');
  // Pausing affects every tenant: the server refuses it to scoped tokens.
  const canPause = () => isAdmin() && session.tenants.includes('*');
  const scopedTenants = () => (session.tenants.includes('*') ? [] : session.tenants);

  /** Shows `text` in the error or result banner (one of each at a time). */
  function banner(kind, text, source) {
    clearBanner(kind);
    const close = h('button', { type: 'button', class: 'close', 'aria-label': 'Dismiss' }, '×');
    const el = h('div', {
      class: `banner ${kind}`,
      role: kind === 'error' ? 'alert' : 'status',
      'data-test': kind,
      'data-source': source,
    }, h('span', {}, text), close);
    close.addEventListener('click', () => el.remove());
    byId('banners').append(el);
  }

  function clearBanner(kind, source) {
    for (const el of byId('banners').querySelectorAll(`.banner.${kind}`)) {
      if (!source || el.dataset.source === source) el.remove();
    }
  }

  /** Shows a failure; `source` names a poller, whose next success clears it. */
  function fail(err, source) {
    if (err && err.auth) return; // the sign-in form is already shown
    const message = err && err.message ? err.message : String(err);
    banner('error', err && err.field ? `${message} (field: ${err.field})` : message, source);
    if (!(err instanceof ApiError)) console.error(err);
  }

  let dismissDialog = () => {};

  /** Asks `text` in a modal of the page; resolves true for OK. */
  function confirmDialog(text) {
    dismissDialog();
    return new Promise((resolve) => {
      const before = document.activeElement;
      const close = (answer) => {
        overlay.remove();
        document.removeEventListener('keydown', onKey);
        dismissDialog = () => {};
        if (before && before.focus) before.focus();
        resolve(answer);
      };
      const onKey = (event) => { if (event.key === 'Escape') close(false); };
      const ok = h('button', { type: 'button', class: 'primary', 'data-test': 'confirm-ok', onclick: () => close(true) }, 'OK');
      const overlay = h('div', { class: 'overlay' },
        h('div', { class: 'dialog', role: 'dialog', 'aria-modal': 'true', 'aria-labelledby': 'confirm-text', 'data-test': 'confirm-dialog' },
          h('p', { id: 'confirm-text', 'data-test': 'confirm-text' }, text),
          h('div', { class: 'actions' },
            h('button', { type: 'button', 'data-test': 'confirm-cancel', onclick: () => close(false) }, 'Cancel'),
            ok)));
      dismissDialog = () => close(false);
      document.addEventListener('keydown', onKey);
      document.body.append(overlay);
      ok.focus();
    });
  }

  function showSession() {
    byId('whoami').textContent = session.name ?? (session.open ? 'anyone (open daemon)' : 'unnamed token');
    byId('scope').textContent = `· tenants ${session.tenants.join(', ')} · ${session.roles.join(', ')}`;
    // An open daemon has no session to end.
    byId('signout').hidden = session.open;
    byId('session').hidden = false;
    byId('nav').hidden = false;
    // Tenant inputs suggest the token's tenants.
    const old = byId('tenant-list');
    if (old) old.remove();
    document.body.append(h('datalist', { id: 'tenant-list' },
      scopedTenants().map((tenant) => h('option', { value: tenant }))));
  }

  function showSignIn() {
    leave();
    byId('nav').hidden = true;
    byId('session').hidden = true;
    const input = h('input', {
      type: 'password', id: 'signin-token', name: 'token', required: true,
      autocomplete: 'current-password', 'data-test': 'signin-token',
    });
    const submit = h('button', { type: 'submit', class: 'primary', 'data-test': 'signin-submit' }, 'Sign in');
    const form = h('form', { class: 'panel signin', method: 'post', 'data-test': 'signin-form' },
      title('Sign in'),
      h('label', { for: 'signin-token' }, 'Token'),
      input,
      h('p', { class: 'muted' }, 'A bearer token from the daemon’s [[tokens]]. It is kept in an HttpOnly cookie until you sign out or close the browser.'),
      submit);
    form.addEventListener('submit', async (event) => {
      event.preventDefault();
      submit.disabled = true;
      try {
        const answer = await api('POST', '/v1/session', { body: { token: input.value }, signIn: true });
        input.value = '';
        signedIn(answer);
      } catch (err) {
        fail(err);
        input.select();
      } finally {
        submit.disabled = false;
      }
    });
    byId('view').replaceChildren(form);
    input.focus();
  }

  function signedIn(answer) {
    session = answer;
    clearBanner('error');
    showSession();
    route();
  }

  /** A 401 from any call: the cookie is gone or its token was removed. */
  function sessionLost() {
    if (!session) return;
    session = null;
    showSignIn();
    banner('error', 'Your session has ended; sign in again.');
  }

  async function signOut() {
    try {
      await api('DELETE', '/v1/session', { signIn: true });
      session = null;
      clearBanner('error');
      clearBanner('result');
      showSignIn();
    } catch (err) {
      fail(err);
    }
  }

  // ------------------------------------------------------------------ routing

  const ROUTES = [
    [/^overview$/, overviewPage],
    [/^messages$/, messagesPage],
    [/^messages\/([^/]+)$/, messageDetailPage],
    [/^dead-letters$/, deadLettersPage],
    [/^dead-letters\/([^/]+)$/, deadLetterDetailPage],
    [/^subscriptions$/, subscriptionsPage],
    [/^subscriptions\/([^/]+)$/, subscriptionDetailPage],
    [/^streams$/, streamsPage],
    [/^streams\/([^/]+)\/([^/]+)\/([^/]+)$/, groupPage],
  ];

  let current = null; // the shown page's context
  let flash = null; // a result to show on the next page rendered

  function parseHash() {
    const raw = location.hash.replace(/^#\/?/, '');
    const q = raw.indexOf('?');
    return {
      path: (q < 0 ? raw : raw.slice(0, q)) || 'overview',
      params: new URLSearchParams(q < 0 ? '' : raw.slice(q + 1)),
    };
  }

  /** Shows the page `path` with `params` (a reload when it is the current one). */
  function go(path, params) {
    const query = qs(params || {});
    const hash = `#/${path}${query ? `?${query}` : ''}`;
    if (location.hash === hash) route();
    else location.hash = hash;
  }

  /** Stops the shown page: its timers, its pending answers, its dialog. */
  function leave() {
    if (current) {
      current.dead = true;
      for (const timer of current.timers) clearTimeout(timer);
      current = null;
    }
    dismissDialog();
  }

  function route() {
    if (!session) return;
    leave();
    const ctx = {
      dead: false,
      timers: new Set(),
      alive: () => !ctx.dead,
      show: (...children) => byId('view').replaceChildren(...children.flat().filter(Boolean)),
    };
    current = ctx;
    clearBanner('error');
    clearBanner('result');
    if (flash) { banner('result', flash); flash = null; }

    const { path, params } = parseHash();
    const section = path.split('/')[0];
    for (const a of byId('nav').querySelectorAll('a')) {
      const active = a.getAttribute('href') === `#/${section}`;
      a.classList.toggle('active', active);
      if (active) a.setAttribute('aria-current', 'page'); else a.removeAttribute('aria-current');
    }
    for (const [pattern, page] of ROUTES) {
      const match = pattern.exec(path);
      if (!match) continue;
      let args;
      try {
        args = match.slice(1).map(decodeURIComponent);
      } catch (_) {
        break; // a malformed escape: not found
      }
      Promise.resolve()
        .then(() => page(ctx, params, ...args))
        .catch((err) => { if (ctx.alive()) fail(err); });
      return;
    }
    ctx.show(title('Not found'), h('p', {}, 'No such page. ', link('overview', null, 'Go to the overview.')));
  }

  /** Runs `fn` now and every `ms` after it finishes, while `ctx` is shown; false stops it. */
  function poll(ctx, ms, source, fn) {
    const tick = async () => {
      let again = true;
      try {
        again = (await fn()) !== false;
        if (ctx.alive()) clearBanner('error', source);
      } catch (err) {
        if (ctx.alive()) fail(err, source);
      }
      if (!again || !ctx.alive()) return;
      const timer = setTimeout(() => { ctx.timers.delete(timer); tick(); }, ms);
      ctx.timers.add(timer);
    };
    tick();
  }

  /** Next / Previous over a list: a stack of the cursors of the pages seen. */
  function pager(load) {
    const stack = [null];
    let next = null;
    const prev = h('button', { type: 'button', 'data-test': 'page-prev' }, '← Previous');
    const forward = h('button', { type: 'button', 'data-test': 'page-next' }, 'Next →');
    const label = h('span', { class: 'muted' });
    prev.addEventListener('click', () => { if (stack.length > 1) { stack.pop(); load(); } });
    forward.addEventListener('click', () => { if (next) { stack.push(next); load(); } });
    const pages = {
      el: h('div', { class: 'pager' }, prev, label, forward),
      get cursor() { return stack[stack.length - 1]; },
      get first() { return stack.length === 1; },
      update(nextCursor) {
        next = nextCursor || null;
        prev.disabled = stack.length === 1;
        forward.disabled = !next;
        label.textContent = `Page ${stack.length}`;
        pages.el.hidden = stack.length === 1 && !next;
      },
    };
    pages.update(null);
    return pages;
  }

  // ------------------------------------------------------------------ filters

  const TENANT = { name: 'tenant', label: 'Tenant', tenant: true };
  const TOPIC = { name: 'topic', label: 'Topic' };
  const SUBSCRIPTION = { name: 'subscription', label: 'Subscription' };
  const MESSAGE_ID = { name: 'message_id', label: 'Message id' };

  /** The non-empty values of `defs` in the hash's parameters. */
  function pick(params, defs) {
    const out = {};
    for (const def of defs) {
      const value = params.get(def.name);
      if (value) out[def.name] = value;
    }
    return out;
  }

  /** A filter form whose values go to the hash of page `path` (times as RFC 3339 UTC). */
  function filterForm(path, defs, params) {
    const controls = defs.map((def) => [def, control(def, params.get(def.name) || '')]);
    const form = h('form', { class: 'filters', 'data-test': 'filters' },
      controls.map(([def, el]) => h('label', {}, h('span', {}, def.label), el)),
      h('button', { type: 'submit', class: 'primary', 'data-test': 'filter-apply' }, 'Apply'),
      h('button', { type: 'button', 'data-test': 'filter-clear', onclick: () => go(path, {}) }, 'Clear'));
    form.addEventListener('submit', (event) => {
      event.preventDefault();
      const values = {};
      for (const [def, el] of controls) {
        values[def.name] = def.time ? fromLocalInput(el.value) : el.value.trim();
      }
      go(path, values);
    });
    return form;
  }

  function control(def, value) {
    const attrs = { name: def.name, 'data-test': `filter-${def.name.replace(/_/g, '-')}` };
    if (def.options) {
      return h('select', attrs, def.options.map((option) =>
        h('option', { value: option, selected: option === value }, option || 'any')));
    }
    if (def.time) {
      return h('input', { ...attrs, type: 'datetime-local', step: '1', value: toLocalInput(value) });
    }
    return h('input', {
      ...attrs, type: 'text', value, spellcheck: 'false', autocomplete: 'off',
      list: def.tenant ? 'tenant-list' : null,
    });
  }

  // ----------------------------------------------------------------- overview

  function overviewPage(ctx, params) {
    const tenant = params.get('tenant') || '';
    const chart = throughputChart();
    const warnings = h('ul', { class: 'warnings', 'data-test': 'warnings' });
    const noWarnings = h('p', { class: 'muted' }, 'No warnings.');
    const statsBox = h('div', {}, loading());
    const pages = pager(() => loadStats().catch(fail));
    // What the warnings are made of, refreshed by the pollers below.
    const state = { paused: [], failing: [], ages: new Map() };

    ctx.show(
      title('Overview'),
      filterForm('overview', [TENANT], params),
      h('div', { class: 'cols' },
        panel('Throughput · last 15 minutes', chart.svg, chart.legend),
        panel('Warnings', warnings, noWarnings)),
      panel('Open deliveries by subscription and topic', statsBox, pages.el));

    async function loadStats() {
      const stats = await api('GET', `/v1/stats?${qs({ tenant, limit: PAGE_SIZE, cursor: pages.cursor })}`);
      if (!ctx.alive()) return;
      trackAges(stats.items);
      statsBox.replaceChildren(statsTable(stats, tenant),
        stats.items.length ? '' : empty('No open deliveries and no completions in the last hour.'));
      pages.update(stats.next_cursor);
      renderWarnings();
    }

    /** Counts, per row, the consecutive polls its oldest pending age grew on. */
    function trackAges(rows) {
      const ages = new Map();
      for (const row of rows) {
        const key = `${row.subscription}\n${row.topic}`;
        const age = row.oldest_pending_age_seconds;
        const before = state.ages.get(key);
        const grew = before && age != null && before.age != null && age > before.age;
        ages.set(key, { subscription: row.subscription, topic: row.topic, age, streak: grew ? before.streak + 1 : 0 });
      }
      state.ages = ages;
    }

    async function loadThroughput() {
      try {
        const series = await api('GET', `/v1/throughput?${qs({ tenant })}`);
        if (ctx.alive()) chart.draw(series);
      } catch (err) {
        if (err.status !== 404) throw err;
        chart.unavailable('This daemon does not report its throughput.');
        return false;
      }
      return true;
    }

    /** Paused subscriptions (first page) and failing targets (first 20). */
    async function loadSubscriptionHealth() {
      const list = await api('GET', '/v1/subscriptions?limit=500');
      const details = await Promise.all(list.items.slice(0, 20).map((sub) =>
        api('GET', `/v1/subscriptions/${enc(sub.name)}`).catch((err) => {
          if (err.auth) throw err;
          return null; // removed meanwhile: no warning
        })));
      if (!ctx.alive()) return;
      state.paused = list.items.filter((sub) => sub.paused).map((sub) => sub.name);
      state.failing = details.filter((detail) => detail && isFailing(detail));
      renderWarnings();
    }

    function renderWarnings() {
      const subLink = (name) => link(`subscriptions/${enc(name)}`, null, name);
      const items = [
        ...state.paused.map((name) => h('li', { class: 'warn', 'data-kind': 'paused' },
          subLink(name), ' is paused: its messages wait until it is resumed.')),
        ...state.failing.map((detail) => h('li', { class: 'bad', 'data-kind': 'failing' },
          subLink(detail.name), ' keeps failing: ', failureText(detail))),
        ...[...state.ages.values()].filter((row) => row.streak >= 3).map((row) =>
          h('li', { class: 'warn', 'data-kind': 'growing' },
            subLink(row.subscription), ` / ${row.topic}: the oldest pending delivery keeps ageing `
            + `(${row.streak} polls in a row, now ${humanAge(row.age)}).`)),
      ];
      warnings.replaceChildren(...items);
      noWarnings.hidden = items.length > 0;
    }

    poll(ctx, 5000, 'stats', loadStats);
    poll(ctx, 1000, 'throughput', loadThroughput);
    poll(ctx, 15000, 'subscriptions', loadSubscriptionHealth);
  }

  /** A failure rate of 50 % or more, or a last error newer than the last success. */
  function isFailing(detail) {
    const rate = detail.failure_rate_5m;
    if (rate != null && rate >= 0.5 && detail.deliveries_5m > 0) return true;
    const error = detail.last_error;
    if (!error) return false;
    return !detail.last_success_at || Date.parse(error.at) > Date.parse(detail.last_success_at);
  }

  function failureText(detail) {
    const parts = [];
    if (detail.failure_rate_5m != null) {
      parts.push(`${percent(detail.failure_rate_5m)} of ${plural(detail.deliveries_5m, 'delivery', 'deliveries')} failed in 5 minutes`);
    }
    if (detail.last_error) {
      parts.push(`last error ${humanAge((Date.now() - Date.parse(detail.last_error.at)) / 1000)} ago: ${detail.last_error.message}`);
    }
    return parts.join('; ');
  }

  function statsTable(stats, tenant) {
    const countLink = (value, field, path, filter) => {
      const cell = numTd(null, field);
      cell.replaceChildren(value ? link(path, { tenant, ...filter }, String(value)) : String(value ?? '—'));
      return cell;
    };
    const rows = stats.items.map((row) => {
      const pair = { subscription: row.subscription, topic: row.topic };
      return h('tr', { 'data-test': 'stats-row' },
        td(link(`subscriptions/${enc(row.subscription)}`, null, row.subscription)),
        h('td', { class: 'mono' }, row.topic),
        countLink(row.available, 'available', 'messages', { ...pair, state: 'available' }),
        countLink(row.running, 'running', 'messages', { ...pair, state: 'running' }),
        numTd(row.retrying, 'retrying'),
        countLink(row.dead, 'dead', 'dead-letters', pair),
        numTd(row.completed_last_hour, 'completed_last_hour'),
        numTd(humanAge(row.oldest_pending_age_seconds), 'oldest_pending_age'));
    });
    const totals = h('tr', { class: 'totals', 'data-test': 'stats-totals' },
      h('td', { colspan: 2 }, 'All'),
      numTd(stats.available, 'available'), numTd(stats.running, 'running'),
      numTd(stats.retrying, 'retrying'), numTd(stats.dead, 'dead'),
      numTd(stats.completed_last_hour, 'completed_last_hour'),
      numTd(humanAge(stats.oldest_pending_age_seconds), 'oldest_pending_age'));
    return table('stats-table',
      ['Subscription', 'Topic', ['Pending', 'num'], ['Running', 'num'], ['Retrying', 'num'],
        ['Dead', 'num'], ['Completed (1 h)', 'num'], ['Oldest pending', 'num']],
      rows, totals);
  }

  /** The live chart: delivered and failed per second, redrawn in place. */
  function throughputChart() {
    const W = 640; const H = 190; const L = 48; const R = 10; const T = 12; const B = 22;
    const chart = svg('svg', {
      viewBox: `0 0 ${W} ${H}`, class: 'chart', 'data-test': 'throughput-chart',
      role: 'img', 'aria-label': 'Deliveries per second over the last 15 minutes',
    });
    const legend = h('div', { class: 'legend', 'data-test': 'throughput-legend' }, 'Loading…');
    const rateText = (v) => (v >= 10 || Number.isInteger(v) ? String(Math.round(v)) : v.toFixed(1));

    /** Seconds each plotted point averages: 900 one-second counts of 0 or 1
     * would draw a comb, 180 five-second averages draw a rate. */
    const POINT_SECONDS = 5;

    function draw(data) {
      const step = data.interval_seconds || 1;
      const delivered = data.delivered || [];
      const failed = data.failed || [];
      const per = Math.max(1, Math.round(POINT_SECONDS / step));
      // Per-second rates, each the mean of `per` buckets.
      const rates = (values) => {
        const out = [];
        for (let i = 0; i < values.length; i += per) {
          const part = values.slice(i, i + per);
          out.push(part.reduce((a, b) => a + b, 0) / (part.length * step));
        }
        return out;
      };
      const deliveredRates = rates(delivered);
      const failedRates = rates(failed);
      const n = Math.max(deliveredRates.length, failedRates.length, 2);
      const top = niceCeil(Math.max(1, ...deliveredRates, ...failedRates));
      const x = (i) => L + (i * (W - L - R)) / (n - 1);
      const y = (perSecond) => T + (1 - perSecond / top) * (H - T - B);
      const line = (values, cls) => svg('polyline', {
        class: cls,
        points: values.map((v, i) => `${x(i).toFixed(1)},${y(v).toFixed(1)}`).join(' '),
      });
      const grid = [0, top / 2, top].map((v) => [
        svg('line', { class: 'gridline', x1: L, x2: W - R, y1: y(v), y2: y(v) }),
        svg('text', { class: 'axis', x: L - 6, y: y(v) + 4, 'text-anchor': 'end' }, `${rateText(v)}/s`),
      ]);
      const secondsPerPoint = per * step;
      const ticks = [15, 10, 5, 0].map((minutes) => {
        const i = Math.min(n - 1, Math.max(0, n - (minutes * 60) / secondsPerPoint));
        const anchor = minutes === 15 ? 'start' : minutes === 0 ? 'end' : 'middle';
        return svg('text', { class: 'axis', x: x(i), y: H - 6, 'text-anchor': anchor }, minutes ? `−${minutes} min` : 'now');
      });
      chart.replaceChildren(...grid.flat(), ...ticks, line(deliveredRates, 'delivered'), line(failedRates, 'failed'));

      // The current rate: the last 10 whole seconds (the last bucket is still filling).
      const recent = (values) => {
        const whole = values.slice(-11, -1);
        return whole.length ? whole.reduce((a, b) => a + b, 0) / (whole.length * step) : 0;
      };
      const sum = (values) => values.reduce((a, b) => a + b, 0);
      legend.replaceChildren(
        h('span', { class: 'key delivered' }), 'Delivered ',
        h('strong', { 'data-test': 'rate-delivered' }, `${rateText(recent(delivered))}/s`),
        h('span', { class: 'key failed' }), 'Failed ',
        h('strong', { 'data-test': 'rate-failed' }, `${rateText(recent(failed))}/s`),
        h('span', { class: 'muted' },
          ` · last 10 s · 15 min: ${sum(delivered)} delivered, ${sum(failed)} failed · until ${data.until ? localTime(data.until) : '—'}`));
    }

    function unavailable(text) {
      chart.replaceChildren(svg('text', { class: 'axis', x: W / 2, y: H / 2, 'text-anchor': 'middle' }, text));
      legend.replaceChildren();
    }

    return { svg: chart, legend, draw, unavailable };
  }

  /** The smallest 1, 2 or 5 times a power of ten at or above `v`. */
  function niceCeil(v) {
    const power = 10 ** Math.floor(Math.log10(v));
    return [1, 2, 5, 10].map((m) => m * power).find((c) => c >= v);
  }

  // ----------------------------------------------------------------- messages

  const MESSAGE_FILTERS = [
    TENANT, TOPIC,
    { name: 'state', label: 'State', options: ['', 'available', 'running', 'dead', 'completed'] },
    SUBSCRIPTION, MESSAGE_ID,
    { name: 'enqueued_after', label: 'Enqueued after', time: true },
    { name: 'enqueued_before', label: 'Enqueued before', time: true },
  ];

  function messagesPage(ctx, params) {
    const filters = pick(params, MESSAGE_FILTERS);
    const box = h('div', {}, loading());
    const pages = pager(() => load().catch(fail));
    ctx.show(title('Messages'), filterForm('messages', MESSAGE_FILTERS, params), box, pages.el);

    async function load() {
      const page = await api('GET', `/v1/messages?${qs({ ...filters, limit: PAGE_SIZE, cursor: pages.cursor })}`);
      if (!ctx.alive()) return;
      box.replaceChildren(messagesTable(page.items), page.items.length ? '' : empty('No messages match.'));
      pages.update(page.next_cursor);
    }
    return load();
  }

  function messagesTable(items) {
    const rows = items.map((m) => h('tr', { 'data-test': 'message-row', 'data-id': m.id },
      h('td', { class: 'mono' }, link(`messages/${enc(m.id)}`, null, m.id)),
      td(m.tenant),
      h('td', { class: 'mono' }, m.topic),
      numTd(m.schema_version, 'schema_version'),
      td(timeEl(m.enqueued_at)),
      // The list answers deliveries only if the server includes them.
      td(m.deliveries ? m.deliveries.map((d) =>
        h('span', { class: 'state' }, `${d.subscription} `, h('span', { class: `badge ${d.state}`, 'data-test': 'delivery-state' }, d.state)))
        : dash())));
    return table('messages-table', ['Id', 'Tenant', 'Topic', ['Version', 'num'], 'Enqueued', 'Subscriptions'], rows);
  }

  async function messageDetailPage(ctx, params, id) {
    ctx.show(title('Message'), loading());
    // Parsed by hand so the payload's numbers stay exactly as stored.
    const tree = parseJson(await api('GET', `/v1/messages/${enc(id)}`, { text: true }));
    if (!ctx.alive()) return;
    const m = plain(tree);
    const deliveries = m.deliveries || [];
    const deliveryRows = deliveries.map((d) => h('tr', { 'data-test': 'delivery-row', 'data-subscription': d.subscription },
      td(link(`subscriptions/${enc(d.subscription)}`, null, d.subscription)),
      td(h('span', { class: `badge ${d.state}`, 'data-test': 'delivery-state' }, d.state)),
      numTd(d.attempts, 'attempts'),
      h('td', { class: 'mono' }, d.delivery_id == null ? dash()
        : d.state === 'dead' ? link(`dead-letters/${enc(d.delivery_id)}`, null, String(d.delivery_id))
          : String(d.delivery_id))));
    const errors = deliveries.flatMap((d) => d.errors.map((e) => ({ subscription: d.subscription, ...e })));
    ctx.show(
      title('Message ', mono(m.id)),
      h('div', { class: 'detail', 'data-test': 'message-detail' },
        panel(null, fields([
          ['Tenant', m.tenant, 'tenant'],
          ['Topic', mono(m.topic), 'topic'],
          ['Schema version', String(m.schema_version), 'schema-version'],
          ['Priority', String(m.priority ?? 0), 'priority'],
          ['Ordering key', m.ordering_key == null ? null : mono(m.ordering_key), 'ordering-key'],
          ['Idempotency key', m.idempotency_key == null ? null : mono(m.idempotency_key), 'idempotency-key'],
          ['Occurred at', timeEl(m.occurred_at), 'occurred-at'],
          ['Available at', timeEl(m.available_at), 'available-at'],
          ['Enqueued at', timeEl(m.enqueued_at), 'enqueued-at'],
        ])),
        panel('Deliveries', table('deliveries-table', ['Subscription', 'State', ['Attempts', 'num'], 'Delivery id'], deliveryRows),
          deliveries.length ? null : h('p', { class: 'muted' }, 'No subscription receives this message.')),
        panel('Error history', errorTable(errors, true)),
        panel('Headers', headersTable(m.headers || {})),
        panel('Payload', h('pre', { class: 'json', 'data-test': 'payload' }, pretty(member(tree, 'payload'))))));
  }

  /** The error history, oldest first; `bySubscription` adds that column. */
  function errorTable(errors, bySubscription) {
    if (!errors.length) return h('p', { class: 'muted' }, 'No errors.');
    const rows = errors.map((e) => h('tr', { 'data-test': 'error-entry' },
      bySubscription ? td(e.subscription) : null,
      numTd(e.attempt, 'attempt'),
      td(timeEl(e.at)),
      h('td', { class: 'message' }, e.message)));
    return table('errors-table',
      [bySubscription ? 'Subscription' : null, ['Attempt', 'num'], 'Time', 'Message'].filter(Boolean), rows);
  }

  function headersTable(headers) {
    const names = Object.keys(headers);
    if (!names.length) return h('p', { class: 'muted' }, 'No headers.');
    return table('headers-table', ['Name', 'Value'],
      names.map((name) => h('tr', {}, h('td', { class: 'mono' }, name), h('td', { class: 'mono' }, headers[name]))));
  }

  // ------------------------------------------------------------- dead letters

  const DEAD_FILTERS = [
    TENANT, TOPIC, SUBSCRIPTION, MESSAGE_ID,
    { name: 'dead_after', label: 'Dead after', time: true },
    { name: 'dead_before', label: 'Dead before', time: true },
  ];

  /**
   * Retries or discards `selection` ({ids} or {filter, all}) after the
   * operator confirms the count. A filter is counted by a dry run; ids are
   * counted as given (the server refuses a dry run of ids). Answers the
   * result's text, or null when nothing was done.
   */
  async function deadLetterOp(op, selection) {
    const path = `/v1/dead-letters/${op}`;
    const count = selection.ids
      ? selection.ids.length
      : (await api('POST', path, { body: { ...selection, dry_run: true } })).affected;
    if (count === 0) return `No dead letters to ${op}: none match.`;
    const verb = op === 'retry' ? 'Retry' : 'Discard';
    if (!(await confirmDialog(`${verb} ${plural(count, 'dead letter')}?`))) return null;
    const done = await api('POST', path, { body: selection });
    return `${op === 'retry' ? 'Retried' : 'Discarded'} ${plural(done.affected, 'dead letter')}.`;
  }

  function deadLettersPage(ctx, params) {
    // A token of several tenants must name one; start with its first.
    const tenants = scopedTenants();
    if (!params.get('tenant') && tenants.length > 1) {
      params.set('tenant', tenants[0]);
      history.replaceState(null, '', `#/dead-letters?${params}`);
    }
    const filters = pick(params, DEAD_FILTERS);
    const admin = isAdmin();
    // The selection: ids on this page, or every dead letter the filter matches.
    const sel = { ids: new Set(), all: false, matching: null };
    let items = [];
    let busy = false;

    const box = h('div', {}, loading());
    const pages = pager(() => { sel.ids.clear(); sel.all = false; load().catch(fail); });
    const selectAll = h('input', { type: 'checkbox', 'data-test': 'dead-letter-select-all' });
    const allLabel = h('span', {}, 'Select all matching');
    const count = h('span', { class: 'muted', 'data-test': 'selection-count' });
    const retry = h('button', { type: 'button', 'data-test': 'dead-letter-retry' }, 'Retry');
    const discard = h('button', { type: 'button', class: 'danger', 'data-test': 'dead-letter-discard' }, 'Discard');
    const toolbar = h('div', { class: 'toolbar' }, h('label', { class: 'check' }, selectAll, allLabel), count, retry, discard);
    selectAll.addEventListener('change', () => { sel.all = selectAll.checked; sel.ids.clear(); sync(); });
    retry.addEventListener('click', () => act('retry'));
    discard.addEventListener('click', () => act('discard'));

    ctx.show(title('Dead letters'), filterForm('dead-letters', DEAD_FILTERS, params),
      admin ? toolbar : null, box, pages.el);

    function filterSelection() {
      // An empty filter means every dead letter the token sees: say so.
      return Object.keys(filters).length ? { filter: { ...filters } } : { filter: {}, all: true };
    }

    async function load() {
      const page = await api('GET', `/v1/dead-letters?${qs({ ...filters, limit: PAGE_SIZE, cursor: pages.cursor })}`);
      if (!ctx.alive()) return;
      items = page.items;
      box.replaceChildren(deadLettersTable(items, admin, toggleOne, togglePage),
        items.length ? '' : empty('No dead letters match.'));
      pages.update(page.next_cursor);
      toolbar.hidden = !items.length;
      sync();
      if (admin && items.length) await countMatching(page);
    }

    async function countMatching(page) {
      if (pages.first && !page.next_cursor) {
        sel.matching = page.items.length; // all of them are on this page
      } else {
        try {
          const preview = await api('POST', '/v1/dead-letters/retry', { body: { ...filterSelection(), dry_run: true } });
          sel.matching = preview.affected;
        } catch (err) {
          if (err.auth) return;
          sel.matching = null;
        }
      }
      if (!ctx.alive()) return;
      allLabel.textContent = sel.matching == null ? 'Select all matching' : `Select all ${sel.matching} matching`;
      sync();
    }

    function toggleOne(id, on) {
      if (on) sel.ids.add(id); else sel.ids.delete(id);
      sync();
    }

    function togglePage(on) {
      for (const d of items) toggleOne(String(d.id), on);
    }

    /** Brings checkboxes, the count and the buttons in line with `sel`. */
    function sync() {
      for (const cb of box.querySelectorAll('[data-test="dead-letter-select"]')) {
        cb.checked = sel.all || sel.ids.has(cb.value);
        cb.disabled = sel.all;
      }
      const pageBox = box.querySelector('[data-test="dead-letter-select-page"]');
      if (pageBox) {
        const chosen = items.filter((d) => sel.ids.has(String(d.id))).length;
        pageBox.checked = sel.all || (chosen > 0 && chosen === items.length);
        pageBox.indeterminate = !sel.all && chosen > 0 && chosen < items.length;
        pageBox.disabled = sel.all;
      }
      selectAll.checked = sel.all;
      if (!sel.all) count.textContent = `${sel.ids.size} selected`;
      else count.textContent = sel.matching == null ? 'all matching selected' : `all ${sel.matching} matching selected`;
      retry.disabled = discard.disabled = busy || (!sel.all && sel.ids.size === 0);
    }

    async function act(op) {
      busy = true;
      sync();
      try {
        const selection = sel.all ? filterSelection() : { ids: [...sel.ids].map(Number) };
        const result = await deadLetterOp(op, selection);
        if (!ctx.alive()) return;
        if (result) {
          banner('result', result);
          sel.ids.clear();
          sel.all = false;
          await load();
        }
      } catch (err) {
        if (ctx.alive()) fail(err);
      } finally {
        busy = false;
        if (ctx.alive()) sync();
      }
    }

    return load();
  }

  function deadLettersTable(items, admin, toggleOne, togglePage) {
    const pageBox = admin ? h('input', { type: 'checkbox', 'data-test': 'dead-letter-select-page', 'aria-label': 'Select this page' }) : null;
    if (pageBox) pageBox.addEventListener('change', () => togglePage(pageBox.checked));
    const rows = items.map((d) => {
      const last = d.errors.length ? d.errors[d.errors.length - 1].message : '';
      let check = null;
      if (admin) {
        check = h('input', { type: 'checkbox', value: String(d.id), 'data-test': 'dead-letter-select', 'aria-label': `Select dead letter ${d.id}` });
        check.addEventListener('change', () => toggleOne(String(d.id), check.checked));
      }
      return h('tr', { 'data-test': 'dead-letter-row', 'data-id': d.id, 'data-message-id': d.message_id },
        admin ? h('td', { class: 'check' }, check) : null,
        h('td', { class: 'mono' }, link(`dead-letters/${enc(d.id)}`, null, String(d.id))),
        h('td', { class: 'mono' }, link(`messages/${enc(d.message_id)}`, null, d.message_id)),
        td(d.tenant),
        td(link(`subscriptions/${enc(d.subscription)}`, null, d.subscription)),
        h('td', { class: 'mono' }, d.topic),
        numTd(d.attempts, 'attempts'),
        h('td', { class: 'message', title: last }, last.length > 140 ? `${last.slice(0, 140)}…` : last),
        td(timeEl(d.dead_at)));
    });
    return table('dead-letters-table',
      [admin ? pageBox : null, 'Id', 'Message', 'Tenant', 'Subscription', 'Topic', ['Attempts', 'num'], 'Last error', 'Dead at']
        .filter((x) => x !== null),
      rows);
  }

  async function deadLetterDetailPage(ctx, params, id) {
    ctx.show(title('Dead letter'), loading());
    const tree = parseJson(await api('GET', `/v1/dead-letters/${enc(id)}`, { text: true }));
    if (!ctx.alive()) return;
    const d = plain(tree);
    const action = (op, label, cls) => {
      const button = h('button', { type: 'button', class: cls, 'data-test': `dead-letter-${op}` }, label);
      button.addEventListener('click', async () => {
        button.disabled = true;
        try {
          const result = await deadLetterOp(op, { ids: [d.id] });
          if (result && ctx.alive()) {
            flash = result; // shown on the list, since this one is gone now
            go('dead-letters', { tenant: d.tenant, subscription: d.subscription });
          }
        } catch (err) {
          if (ctx.alive()) fail(err);
        } finally {
          button.disabled = false;
        }
      });
      return button;
    };
    ctx.show(
      title('Dead letter ', mono(String(d.id))),
      isAdmin() ? h('div', { class: 'toolbar' }, action('retry', 'Retry'), action('discard', 'Discard', 'danger')) : null,
      h('div', { class: 'detail', 'data-test': 'dead-letter-detail' },
        panel(null, fields([
          ['Message', link(`messages/${enc(d.message_id)}`, null, mono(d.message_id)), 'message-id'],
          ['Subscription', link(`subscriptions/${enc(d.subscription)}`, null, d.subscription), 'subscription'],
          ['Tenant', d.tenant, 'tenant'],
          ['Topic', mono(d.topic), 'topic'],
          ['Schema version', String(d.schema_version), 'schema-version'],
          ['Attempts', String(d.attempts), 'attempts'],
          ['Dead at', timeEl(d.dead_at), 'dead-at'],
          ['Enqueued at', timeEl(d.enqueued_at), 'enqueued-at'],
        ])),
        panel('Error history', errorTable(d.errors || [], false)),
        panel('Payload', h('pre', { class: 'json', 'data-test': 'payload' }, pretty(member(tree, 'payload'))))));
  }

  // ------------------------------------------------------------ subscriptions

  function subscriptionsPage(ctx) {
    const box = h('div', {}, loading());
    const pages = pager(() => load().catch(fail));
    ctx.show(title('Subscriptions'), box, pages.el);

    async function load() {
      const page = await api('GET', `/v1/subscriptions?${qs({ limit: PAGE_SIZE, cursor: pages.cursor })}`);
      if (!ctx.alive()) return;
      const rows = page.items.map((s) => h('tr', { 'data-test': 'subscription-row', 'data-name': s.name },
        td(link(`subscriptions/${enc(s.name)}`, null, s.name)),
        h('td', { class: 'mono' }, s.topics.join(', ')),
        td(s.paused ? badge('paused') : badge('active')),
        // The list has no target; shown if the server adds it.
        td(s.target ? s.target.type : dash()),
        td(timeEl(s.created_at))));
      box.replaceChildren(
        table('subscriptions-table', ['Name', 'Topics', 'State', 'Target', 'Created'], rows),
        rows.length ? '' : empty('No subscriptions.'));
      pages.update(page.next_cursor);
    }
    return load();
  }

  async function subscriptionDetailPage(ctx, params, name) {
    ctx.show(title('Subscription ', mono(name)), loading());
    const d = await api('GET', `/v1/subscriptions/${enc(name)}`);
    if (!ctx.alive()) return;
    const paused = d.state === 'paused';
    let toggle = null;
    if (canPause()) {
      toggle = h('button', { type: 'button', class: paused ? 'primary' : 'danger', 'data-test': paused ? 'resume' : 'pause' },
        paused ? 'Resume' : 'Pause');
      toggle.addEventListener('click', async () => {
        toggle.disabled = true;
        try {
          const answer = await api('POST', `/v1/subscriptions/${enc(name)}/${paused ? 'resume' : 'pause'}`);
          if (!ctx.alive()) return;
          flash = `${answer.name} is ${answer.paused ? 'paused' : 'resumed'}.`;
          route(); // shows the new state
        } catch (err) {
          if (ctx.alive()) { fail(err); toggle.disabled = false; }
        }
      });
    }
    const target = d.target;
    const rate = d.failure_rate_5m;
    ctx.show(
      title('Subscription ', mono(d.name)),
      h('div', { class: 'detail', 'data-test': 'subscription-detail' },
        panel(null, h('div', { class: 'toolbar' }, h('span', { class: `badge ${d.state}`, 'data-test': 'subscription-state' }, d.state), toggle), fields([
          ['Topics', mono(d.topics.join(', ')), 'topics'],
          ['Created', timeEl(d.created_at), 'created-at'],
        ])),
        h('div', { class: 'cols even' },
          panel('Target', target
            ? fields([['Type', target.type, 'target-type'], ['URL', target.url && mono(target.url), 'target-url'],
              ['Stream', target.stream && mono(target.stream), 'target-stream'], ['Subject', target.subject && mono(target.subject), 'target-subject']])
            : h('p', { class: 'muted' }, 'Not in this daemon’s config (a library worker’s subscription).'),
          d.retry_policy ? [h('h2', {}, 'Retry policy'), fields(Object.entries(d.retry_policy).map(([k, v]) => [k, String(v)]))] : null),
          panel('Backlog', fields([
            ['Pending', String(d.backlog.available), 'backlog-available'],
            ['Retrying', String(d.backlog.retrying ?? '—'), 'backlog-retrying'],
            ['Running', String(d.backlog.running), 'backlog-running'],
            ['Dead', d.backlog.dead ? link('dead-letters', { subscription: d.name }, String(d.backlog.dead)) : '0', 'backlog-dead'],
            ['Oldest pending', humanAge(d.oldest_pending_age_seconds), 'oldest-pending'],
          ])),
          panel('Health (this daemon)', fields([
            ['Last success', d.last_success_at ? timeEl(d.last_success_at, true) : 'none since the daemon started', 'last-success'],
            ['Last error', d.last_error ? [timeEl(d.last_error.at, true), h('div', { class: 'message' }, d.last_error.message)] : 'none', 'last-error'],
            ['Failure rate', rate == null ? 'no deliveries in 5 minutes'
              : `${percent(rate)} of ${plural(d.deliveries_5m, 'delivery', 'deliveries')} in 5 minutes`, 'failure-rate'],
          ])))));
  }

  // ------------------------------------------------------------------ streams

  function streamsPage(ctx, params) {
    const tenant = params.get('tenant') || '';
    const box = h('div', {}, loading());
    const pages = pager(() => load().catch(fail));
    ctx.show(title('Streams'), filterForm('streams', [TENANT], params), box, pages.el);

    async function load() {
      let page;
      try {
        page = await api('GET', `/v1/streams?${qs({ tenant, limit: PAGE_SIZE, cursor: pages.cursor })}`);
      } catch (err) {
        if (err.status !== 404) throw err;
        box.replaceChildren(h('p', { class: 'notice', 'data-test': 'empty' }, 'This daemon has no stream backend configured.'));
        return;
      }
      if (!ctx.alive()) return;
      const rows = page.items.flatMap((s) => [
        h('tr', { class: 'stream', 'data-test': 'stream-row', 'data-tenant': s.tenant, 'data-stream': s.stream },
          td(s.tenant), h('td', { class: 'mono' }, s.stream), numTd(s.length, 'length'),
          h('td', { class: 'mono' }, s.last_id ?? '—'),
          h('td', { colspan: 5, class: 'muted' }, plural(s.groups.length, 'group'))),
        ...s.groups.map((g) => h('tr', { class: 'group', 'data-test': 'group-row', 'data-group': g.name },
          h('td', { colspan: 4 }),
          td(link(`streams/${enc(s.tenant)}/${enc(s.stream)}/${enc(g.name)}`, null, g.name)),
          numTd(Array.isArray(g.consumers) ? g.consumers.length : g.consumers, 'consumers'),
          numTd(g.pending, 'pending'),
          numTd(g.lag, 'lag'),
          h('td', { class: 'mono' }, g.last_delivered_id ?? '—'))),
      ]);
      box.replaceChildren(
        table('streams-table', ['Tenant', 'Stream', ['Length', 'num'], 'Last id', 'Group',
          ['Consumers', 'num'], ['Pending', 'num'], ['Lag', 'num'], 'Last delivered'], rows),
        rows.length ? '' : empty('No streams.'));
      pages.update(page.next_cursor);
    }
    return load();
  }

  async function groupPage(ctx, params, tenant, stream, group) {
    const base = `/v1/streams/${enc(tenant)}/${enc(stream)}/groups/${enc(group)}`;
    const heading = title('Group ', mono(group));
    const crumbs = h('p', { class: 'muted' }, link('streams', { tenant }, 'Streams'), ` / ${tenant} / ${stream}`);
    ctx.show(heading, crumbs, loading());
    const [list, pending] = await Promise.all([
      api('GET', `${base}/consumers`),
      api('GET', `${base}/pending?count=100`),
    ]);
    if (!ctx.alive()) return;
    const idle = (ms) => humanAge(ms / 1000);
    const consumerRows = list.consumers.map((c) => h('tr', { 'data-test': 'consumer-row', 'data-name': c.name },
      h('td', { class: 'mono' }, c.name),
      numTd(c.pending, 'pending'),
      numTd(idle(c.idle_ms), 'idle'),
      td(c.idle_ms > HOUR_MS ? badge('idle') : null)));
    const pendingRows = pending.entries.map((e) => h('tr', { 'data-test': 'pending-row' },
      h('td', { class: 'mono' }, e.id), h('td', { class: 'mono' }, e.consumer),
      numTd(idle(e.idle_ms), 'idle'), numTd(e.deliveries, 'deliveries')));
    const summary = pending.summary;
    ctx.show(heading, crumbs,
      panel('Consumers', table('consumers-table', ['Consumer', ['Pending', 'num'], ['Idle for', 'num'], ''], consumerRows),
        consumerRows.length ? '' : empty('No consumers.')),
      panel('Pending entries',
        h('p', { class: 'muted' }, `${summary.count} pending`,
          summary.lowest ? `, ids ${summary.lowest} to ${summary.highest}` : '',
          summary.count > pending.entries.length ? ` (the first ${pending.entries.length} shown)` : ''),
        pendingRows.length ? table('pending-table', ['Id', 'Consumer', ['Idle for', 'num'], ['Deliveries', 'num']], pendingRows) : null));
  }

  // --------------------------------------------------------------------- boot

  async function boot() {
    byId('signout').addEventListener('click', signOut);
    window.addEventListener('hashchange', route);
    try {
      signedIn(await api('GET', '/v1/session', { signIn: true }));
    } catch (err) {
      showSignIn();
      if (err.status !== 401) fail(err);
    }
  }

  boot();
})();
