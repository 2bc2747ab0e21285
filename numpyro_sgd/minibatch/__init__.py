"""How minibatch rows are drawn: the minibatch laws and the choice among them.
"""
