"""Forced alignment (``forced``) and its pictures (``plot``); import them from
:mod:`lightning_gtn.functional`."""
