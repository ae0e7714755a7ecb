"""``python -m bench render``: how fast one template version renders.

Renders a realistic transactional email (about 5 KB of table-laid-out html,
a subject, no text part so the text is derived, and 10 variables of all three
types) through ``tidings.rendering.render``, the function every sending path
calls, with different values each time, as a broadcast to many contacts
would. The first render, which compiles the version, is timed on its own.
No service and no database: only the renderer.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

from bench.harness import log
from tidings.rendering import Variable, render

VARIABLES = (
    Variable("FIRST_NAME", "string", "there"),
    Variable("ORDER_ID", "string"),
    Variable("ORDER_URL", "string"),
    Variable("ITEM_NAME", "string"),
    Variable("QUANTITY", "number", 1),
    Variable("TOTAL", "number"),
    Variable("CURRENCY", "string", "EUR"),
    Variable("GIFT", "boolean", False),
    Variable("DELIVERY_DATE", "string"),
    Variable("SUPPORT_EMAIL", "string", "help@shop.example"),
)

ROW = """
      <tr>
        <td style="padding: 8px 24px; font-family: Helvetica, Arial, sans-serif; font-size: 14px;
                   color: #333333; border-bottom: 1px solid #eeeeee;">{label}</td>
        <td style="padding: 8px 24px; font-family: Helvetica, Arial, sans-serif; font-size: 14px;
                   color: #333333; border-bottom: 1px solid #eeeeee;
                   text-align: right;">{value}</td>
      </tr>"""

HTML = (
    """<!DOCTYPE html>
<html lang="en">
<head>
  <meta charset="utf-8">
  <meta name="viewport" content="width=device-width, initial-scale=1">
  <title>Your order {{{ORDER_ID}}}</title>
  <style>
    body { margin: 0; padding: 0; background: #f4f4f7; }
    .button { background: #2d6cdf; color: #ffffff; border-radius: 4px; padding: 12px 24px;
              text-decoration: none; display: inline-block; font-weight: bold; }
    @media (max-width: 600px) { .container { width: 100% !important; } }
  </style>
</head>
<body>
  <!-- preheader -->
  <div style="display:none; max-height:0; overflow:hidden;">
    Order {{{ORDER_ID}}} arrives on {{{DELIVERY_DATE}}} &#8199;&#65279;&#847;
  </div>
  <table role="presentation" width="100%" cellpadding="0" cellspacing="0" border="0"
         style="background: #f4f4f7;">
    <tr><td align="center" style="padding: 24px 0;">
    <table role="presentation" class="container" width="600" cellpadding="0" cellspacing="0"
           border="0" style="background: #ffffff; border-radius: 8px;">
      <tr>
        <td colspan="2" style="padding: 32px 24px 8px; font-family: Helvetica, Arial, sans-serif;">
          <h1 style="margin: 0; font-size: 22px; color: #111111;">
            Thanks for your order, {{{FIRST_NAME}}}!</h1>
        </td>
      </tr>
      <tr>
        <td colspan="2" style="padding: 8px 24px 24px; font-family: Helvetica, Arial, sans-serif;
                               font-size: 15px; line-height: 22px; color: #333333;">
          <p>We have received order <strong>{{{ORDER_ID}}}</strong> and are getting it ready.
          It should reach you on <strong>{{{DELIVERY_DATE}}}</strong>.</p>
          <p>Here is what you ordered:</p>
        </td>
      </tr>"""
    + ROW.format(label="Item", value="{{{ITEM_NAME}}}")
    + ROW.format(label="Quantity", value="{{{QUANTITY}}}")
    + ROW.format(label="Gift wrapping", value="{{{GIFT}}}")
    + ROW.format(label="Total", value="{{{TOTAL}}} {{{CURRENCY}}}")
    + """
      <tr>
        <td colspan="2" align="center" style="padding: 32px 24px;">
          <a class="button" href="{{{ORDER_URL}}}">View your order</a>
        </td>
      </tr>
      <tr>
        <td colspan="2" style="padding: 16px 24px 32px; font-family: Helvetica, Arial, sans-serif;
                               font-size: 12px; line-height: 18px; color: #888888;">
          <p>Questions? Write to <a href="mailto:{{{SUPPORT_EMAIL}}}">{{{SUPPORT_EMAIL}}}</a>
          and quote {{{ORDER_ID}}}.</p>
          <p>Shop Example Ltd &middot; 1 Market Street &middot; Springfield<br>
          You get this email because you placed an order with us.</p>
        </td>
      </tr>
    </table>
    </td></tr>
  </table>
</body>
</html>
"""
)


@dataclass(frozen=True)
class Version:
    subject: str
    html: str
    text: str | None
    variables: tuple[Variable, ...]


VERSION = Version(
    subject="{{{FIRST_NAME}}}, your order {{{ORDER_ID}}} is confirmed",
    html=HTML,
    text=None,
    variables=VARIABLES,
)

NAMES = ("Ada", "Grace", "Linus", "Barbara <b>&</b> Co", "Zoë", "Ken", "Margaret", "Dennis")


def values(n: int) -> dict[str, object]:
    """The values of the ``n``th render: some supplied, the rest from fallbacks."""
    supplied: dict[str, object] = {
        "ORDER_ID": f"A-{n:06d}",
        "ORDER_URL": f"https://shop.example/orders/A-{n:06d}?utm_source=email",
        "ITEM_NAME": "Espresso machine",
        "TOTAL": 199.5 + n % 7,
        "DELIVERY_DATE": "2026-07-14",
    }
    if n % 2:
        supplied["FIRST_NAME"] = NAMES[n % len(NAMES)]
        supplied["QUANTITY"] = n % 3 + 1
        supplied["GIFT"] = True
    return supplied


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--renders", type=int, default=10_000, help="how many renders")


def run(args: argparse.Namespace) -> dict[str, object]:
    inputs = [values(n) for n in range(args.renders)]
    started = time.perf_counter()
    first = render(VERSION, inputs[0])
    compile_seconds = time.perf_counter() - started
    log(
        f"template: {len(HTML)} bytes of html, {len(VARIABLES)} variables; "
        f"rendered html {len(first.html)} bytes, derived text {len(first.text)} bytes"
    )
    started = time.perf_counter()
    for supplied in inputs:
        render(VERSION, supplied)
    seconds = time.perf_counter() - started
    log(f"{args.renders} renders in {seconds:.3f}s")
    return {
        "benchmark": "render",
        "renders": args.renders,
        "html_bytes": len(HTML),
        "variables": len(VARIABLES),
        "seconds": round(seconds, 4),
        "renders_per_second": round(args.renders / seconds),
        "first_render_with_compile_ms": round(compile_seconds * 1000, 3),
    }
