"""What the tc backends share: the tc object model, the classification rules, the clsact qdisc, the map classifier.

Imports no backend; htb, edt and marks import it.
"""
