"""The web page at ``/`` and its files (:mod:`~fun_asr.serve.protocols.web.routes`)."""

from __future__ import annotations

from fun_asr.serve.protocols.web.routes import ASSETS, add_web_routes, is_page_request

__all__ = ["ASSETS", "add_web_routes", "is_page_request"]
