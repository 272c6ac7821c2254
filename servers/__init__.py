"""Deprecated alias, kept for one release: the KServe and Ray Serve doors are :mod:`doors.kserve` now.

Ray Serve configs and KubeRay RayServices written before the move name ``servers.ray_deployment:build_app``; it still
imports.
"""
