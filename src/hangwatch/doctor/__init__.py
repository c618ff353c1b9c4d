"""``hangwatch doctor``: what makes an inference server hang at startup, checked before launch.

session.py collects the facts (collect/), judges them (analyse/doctor/) and reports (render/doctor_text.py).
"""
